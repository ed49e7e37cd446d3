"""`ReusedBuilds`: a workload factory that builds each (preset, seed) once and hands out copies.

The correctness gate trains about ten short trajectories per config, each from a fresh build of
the same (preset, seed) (`trainers.gate.trajectories.trajectory`). Building a 1.1B-parameter
decoder draws 1.1B random weights on the CPU: 18 s on the H100 machine, against 7 s for the 20
steps it then trains. A deep copy of the built workload is a memory copy (about 1 s for 4.4 GB).

A copy is only a stand-in for a fresh build when nothing outside the workload changes between
builds. So `ReusedBuilds` also restores, on every copy it hands out, the global random states the
factory left behind (torch's CPU and CUDA generators, Python's `random`, NumPy's legacy
generator): a run after a copy draws what it would have drawn after a build. And it refuses to
copy (it calls the factory every time) a workload whose functions hold objects that a deep copy
cannot reach: a `loss_fn` closure over the model would go on computing with the original's
weights while the copy trained.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import random
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from trainers.workloads.base import Workload, WorkloadFactory

try:  # NumPy is optional: a factory that draws from it has it installed.
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
    np = None  # type: ignore[assignment]


@dataclasses.dataclass(frozen=True, slots=True)
class _RandomStates:
    """The global random states right after a build."""

    cpu: torch.Tensor
    cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any

    @classmethod
    def now(cls) -> _RandomStates:
        # Reading CUDA's state starts CUDA, which runs a seed the factory queued
        # (`torch.manual_seed` before CUDA started): the state read is the seeded one. Only where
        # a GPU is present; the gate's processes there use it anyway.
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return cls(
            cpu=torch.get_rng_state(),
            cuda=cuda,
            python=random.getstate(),
            numpy=None if np is None else np.random.get_state(),
        )

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        if np is not None and self.numpy is not None:
            np.random.set_state(self.numpy)


class ReusedBuilds:
    """Call like the factory it wraps; the same (preset, seed) is built once.

    The first call of a (preset, seed) builds, checks that a deep copy of the result is
    independent of it (`unreachable`), and keeps a pristine copy; each call after that returns a
    new deep copy of the pristine one, with the global random states the build left. At most
    `keep` (preset, seed) are kept, the least recently used going first (a 1.1B model's pristine
    copy is 4.4 GB of host memory), and past the first only while the host's available memory
    holds `HOST_ROOM` times the newest (`room_for`): a seed envelope trains the reference from
    four other seeds, and at 1.2B each build was 18 s of a 111 s envelope, then one more for the
    reference's seed it had pushed out (2026-12-01). A workload a copy cannot stand in for is
    built by the factory on every call; `reason` says why. `builds` counts the factory's calls,
    `copies` the copies handed out.
    """

    def __init__(self, factory: WorkloadFactory, *, keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep!r} is invalid: allowed 1 or more")
        self.factory = factory
        self.keep = keep
        self.builds = 0
        self.copies = 0
        self.reason: str | None = None
        self._kept: collections.OrderedDict[tuple[str, int], tuple[Workload, _RandomStates]] = (
            collections.OrderedDict()
        )

    @property
    def kept(self) -> list[tuple[str, int]]:
        """The (preset, seed) kept, least recently used first."""
        return list(self._kept)

    def room_for_another(self) -> bool:
        """Whether another build would be kept beside those kept now: copies stand in for this
        factory's builds, one is kept, more may be, and the host holds another of the newest's
        size (`room_for`)."""
        if self.reason is not None or not self._kept or len(self._kept) >= self.keep:
            return False
        # The build and its pristine copy are both held when the room is checked again, after
        # it (`_make_room`): two more of its size, or the oldest kept would go to make room.
        return self._room_beside_newest(spare=2)

    def __call__(self, preset: str, *, seed: int) -> Workload:
        key = (preset, seed)
        if key in self._kept:
            self._kept.move_to_end(key)
            self._make_room()  # memory may have tightened since it was kept
            pristine, states = self._kept[key]
            found = copy.deepcopy(pristine)
            states.restore()
            self.copies += 1
            return found
        while len(self._kept) >= self.keep:
            self._kept.popitem(last=False)  # the old one's memory before the build's
        built = self.factory(preset, seed=seed)
        self.builds += 1
        states = _RandomStates.now()
        if self.reason is None and isinstance(built, Workload):
            memo: dict[int, Any] = {}
            try:
                pristine = copy.deepcopy(built, memo)
            except Exception as exc:  # noqa: BLE001 - a lock, an open file: built every time
                # It had ended the run as "the factory raised TypeError: cannot pickle
                # '_thread.lock' object", a model a plain loop trains (a probe, 2026-12-07).
                self.reason = f"it cannot be copied ({type(exc).__name__}: {exc})"
                states.restore()
                return built
            self.reason = unreachable(pristine, memo)
            if self.reason is None:
                self._kept[key] = (pristine, states)
                self._make_room()
            # Copying must not change what the build left: deepcopy draws nothing, but a
            # `__deepcopy__` of the user's might.
            states.restore()
        return built

    def _make_room(self) -> None:
        """Let the oldest builds go while more than one is kept and the host lacks the room for
        another copy of the newest beside them (`room_for`), or the newest holds GPU memory (a
        factory that builds on the GPU: its copies are not the host's to count)."""
        while len(self._kept) > 1 and not self._room_beside_newest():
            self._kept.popitem(last=False)

    def _room_beside_newest(self, *, spare: int = 0) -> bool:
        """Whether the newest kept build is in host memory and the host holds `room_for` its
        size (with `spare` more copies)."""
        newest, _ = next(reversed(self._kept.values()))
        return on_the_cpu(newest) and room_for(workload_bytes(newest), spare=spare)


HOST_ROOM = 4
"""How many times a build's size the host's available memory must hold for a second build to be
kept beside the first: the copy a run takes, the measuring process's own build and its DataLoader
workers' pages, and a margin."""


def _tensors(workload: Workload) -> list[torch.Tensor]:
    return [*workload.model.parameters(), *workload.model.buffers()]


def workload_bytes(workload: Workload) -> int:
    """The bytes of `workload`'s parameters and buffers, where its host memory goes."""
    return sum(t.numel() * t.element_size() for t in _tensors(workload))


def on_the_cpu(workload: Workload) -> bool:
    """Whether every parameter and buffer of `workload` is in host memory."""
    return all(t.device.type == "cpu" for t in _tensors(workload))


def host_available_bytes() -> int | None:
    """The memory this process could still take: the kernel's `MemAvailable`, within this
    process's cgroup's limit where one is set (v2, or v1's memory controller); None where
    neither can be read (not Linux)."""
    found = [_meminfo_available()]
    for limit, used in _cgroup_files():
        try:
            with open(limit) as a, open(used) as b:
                text = a.read().strip()
                if text != "max" and int(text) < 2**60:  # v1 writes a huge number for none
                    found.append(int(text) - int(b.read().strip()))
        except (OSError, ValueError):
            continue
    known = [value for value in found if value is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _cgroup_files() -> list[tuple[str, str]]:
    """(limit, usage) files of this process's memory cgroup: v2's under its path in
    /proc/self/cgroup, v1's memory controller, and the root's (a cgroup namespace shows its own
    as the root)."""
    files = [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ]
    try:
        with open("/proc/self/cgroup") as lines:
            for line in lines:
                number, controllers, path = line.rstrip("\n").split(":", 2)
                if number == "0" and path not in ("", "/"):
                    base = f"/sys/fs/cgroup{path}"
                    files.append((f"{base}/memory.max", f"{base}/memory.current"))
                elif "memory" in controllers.split(",") and path not in ("", "/"):
                    base = f"/sys/fs/cgroup/memory{path}"
                    files.append((f"{base}/memory.limit_in_bytes", f"{base}/memory.usage_in_bytes"))
    except (OSError, ValueError):
        pass
    return files


def room_for(nbytes: int, *, spare: int = 0) -> bool:
    """Whether the host holds `HOST_ROOM` (plus `spare`) times `nbytes` more now (False where it
    cannot say)."""
    available = host_available_bytes()
    return available is not None and available >= (HOST_ROOM + spare) * nbytes


def unreachable(copied: Workload, memo: dict[int, Any]) -> str | None:
    """Why `copied` (a deep copy made with `memo`) is not independent of its original, or None.

    Deep copy copies objects but not functions: a function field (`loss_fn`, `make_optimizer`,
    ...) of the copy is the original's, with the original's closure. A closure, default or
    partial argument that holds an object the copy has its own copy of (in `memo`), a module or a
    tensor, ties the copy to the original.
    """
    for field in dataclasses.fields(copied):
        value = getattr(copied, field.name)
        for held in _held_by(value):
            if id(held) in memo and memo[id(held)] is not held:
                return f"workload field {field.name!r} holds an object of the build it came from"
            if isinstance(held, nn.Module | torch.Tensor):
                return f"workload field {field.name!r} holds a {type(held).__name__}"
    return None


def _held_by(value: object, depth: int = 0) -> Iterator[object]:
    """The objects a function's closure and defaults hold, and what those hold in turn (two
    levels into containers and nested functions). A partial's arguments are deep-copied with
    it; only its function is the original's."""
    if depth > 2:
        return
    held: list[object] = []
    if isinstance(value, types.FunctionType):
        held += [cell.cell_contents for cell in value.__closure__ or () if _filled(cell)]
        held += list(value.__defaults__ or ()) + list((value.__kwdefaults__ or {}).values())
    elif isinstance(value, functools.partial):
        yield from _held_by(value.func, depth + 1)
        return
    elif depth > 0 and isinstance(value, list | tuple | set | frozenset):
        held += list(value)
    elif depth > 0 and isinstance(value, dict):
        held += list(value.values())
    for item in held:
        yield item
        yield from _held_by(item, depth + 1)


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True
