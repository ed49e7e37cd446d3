"""The locks must agree with pyproject.toml: re-lock (`python tools/lock.py`) whenever a
dependency range or extra changes."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tools.lock import DIGEST_PREFIX, LOCKS, ROOT, Lock, pyproject_digest

BY_NAME = {lock.path.name: lock for lock in LOCKS}


def locked(lock: Lock) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in lock.path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = Version(version)
    return pins


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_lock_was_made_from_this_pyproject(name: str) -> None:
    first = BY_NAME[name].path.read_text().splitlines()[0]
    assert first.startswith(DIGEST_PREFIX), "requirements.lock was not made by tools/lock.py"
    assert first.removeprefix(DIGEST_PREFIX) == pyproject_digest(), (
        "pyproject.toml's dependencies changed since requirements.lock was made: "
        "run `python tools/lock.py` and commit the locks"
    )


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_requirement_is_pinned_inside_its_range(name: str) -> None:
    lock = BY_NAME[name]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *(r for e in lock.extras for r in extras[e])]
    pins = locked(lock)
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is required by pyproject.toml but not in the lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"the lock pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}"
        )


def test_the_digest_sees_a_changed_range(tmp_path: Path) -> None:
    original = (ROOT / "pyproject.toml").read_text()
    changed = tmp_path / "pyproject.toml"
    changed.write_text(original.replace('"optuna>=4.0"', '"optuna>=4.1"'))
    assert '"optuna>=4.0"' in original
    assert pyproject_digest(changed) != pyproject_digest()


# -- a GPU user's install (issue 56): the lock less torch, so a CUDA build is kept -----------


def test_the_keep_torch_constraints_are_the_lock_less_torchs_own_pins() -> None:
    from tools.lock_without_torch import KEEP_TORCH, LOCK, TORCH_OWN, without_torch

    assert KEEP_TORCH.read_text() == without_torch(LOCK.read_text()), (
        "requirements-keep-torch.lock is stale: run `python tools/lock_without_torch.py`"
    )
    names = {
        canonicalize_name(line.split("==")[0])
        for line in KEEP_TORCH.read_text().splitlines()
        if line and not line.startswith("#")
    }
    locked = {
        canonicalize_name(line.split("==")[0])
        for line in LOCK.read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert "torch" in locked and names == locked - set(TORCH_OWN)


def test_the_readme_installs_on_a_gpu_through_the_keep_torch_constraints() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install -c requirements-keep-torch.lock ." in readme


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU and a CUDA build of torch")
def test_the_readme_gpu_install_keeps_the_cuda_torch(tmp_path: Path) -> None:
    """The README's command in a venv that sees the image's CUDA torch: torch is the same build
    after it, and streamtune imports. Run on a GPU machine (marked `gpu`)."""
    import subprocess
    import sys
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # Where this interpreter is itself a venv (the GPU image's torch lives in /opt/torch/.venv),
    # "system" site-packages are its base's, without torch: the venv is pointed at this
    # interpreter's packages too, after its own, as an environment that has CUDA torch.
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    outer = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(own) / "_outer_site.pth").write_text("".join(f"{path}\n" for path in outer))
    probe = "import torch; print(torch.__version__, torch.version.cuda)"

    def torch_build() -> str:
        return subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.strip()

    before = torch_build()
    assert not before.endswith("None"), f"not a CUDA build of torch: {before}"
    # A machine with no package index (the lent GPU machines) is given the wheels instead
    # (tools/keep_torch_wheels.sh): the same command, offline.
    wheelhouse = os.environ.get("STREAMTUNE_WHEELHOUSE")
    offline = (
        ["--no-index", *(f"--find-links={ROOT / d}" for d in wheelhouse.split(os.pathsep))]
        if wheelhouse
        else []
    )
    done = subprocess.run(
        [python, "-m", "pip", "install", *offline, "-c", "requirements-keep-torch.lock", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert torch_build() == before
    imported = subprocess.run(
        [python, "-c", "import tuner, trainers; print(tuner.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0 and str(venv) in imported.stdout, imported.stderr
