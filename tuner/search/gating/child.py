"""One long-lived spawned child process (`ChildProcess`) and what runs in one: the gate's
(`tuner.search.gating.isolated.ParityProcess`), the profiles' (`tuner.search.deciding.
profile_child`) and a data-parallel gate's (`tuner.search.gating.dpgate`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def fork_dataloader_workers() -> None:
    """A spawned child defaults to spawning its own children too, which would make every
    DataLoader worker import torch again (about 1 s each on a CPU); the training process forks
    them, so the child does the same."""
    if "fork" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("fork", force=True)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """A build ahead of its call on one thread: a core of its own, beside the measurement."""
    import torch  # in the child

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def give_back_memory() -> None:
    """Return what this child's allocator cached to the GPU: the measuring process runs the next
    trial while this child waits, and on a large model needs that memory (the child keeps only
    its workload's model between calls)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class ChildProcess:
    """One long-lived spawned child process that runs functions one at a time, started on the
    first call. The caller waits for each call: the child never runs on the GPU beside a
    measurement. Only what `submit` starts ahead runs beside one: a workload's build, on one
    core of the CPU (`ProfileProcess.prepare`, `ParityProcess.prepare`), and a config's warm-up
    beside the gate, which measures no speed (`ProfileProcess.warm`).

    A call that raises ends its child; the next call starts a new one. What a failure leaves in
    a process outlives the call: on the 1.1B preset at 16 x 2048 tokens a gate run that ran out of
    memory left its child holding 60 GB of the H100's 80, and every trial of the job after it
    ran out of memory too (docs/benchmarks/raw/default-job-h100-2026-11-26-llama-1b-130e597/);
    at 3643f53 a failed checkpointed block left its hooks pushed for every later run."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._ahead: list[concurrent.futures.Future[Any]] = []

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._failed_ahead():
            # What was started ahead (`submit`) failed, or its child died: a new child, as
            # after any call that raised (the class doc).
            self.close()
        try:
            return self._started().submit(fn, *args).result()
        except BaseException:
            self.close()  # its memory and state go with it (the class doc)
            raise

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Start `fn` in the child without waiting for it; the next `call` waits for it, and
        starts a new child where it (or anything else started ahead) failed."""
        future = self._started().submit(fn, *args)
        self._ahead.append(future)
        return future

    def settle(self) -> bool:
        """Wait until what was started ahead has ended. Where any of it failed, its child goes
        at once, and what it holds on the GPU with it (the class doc): False."""
        concurrent.futures.wait(self._ahead)
        if self._failed_ahead():
            self.close()
            return False
        return True

    def running(self) -> bool:
        """Whether anything started ahead (`submit`) still runs."""
        return not all(future.done() for future in self._ahead)

    def end_unfinished(self) -> bool:
        """End the child now where what was started ahead still runs: its work is lost and its
        GPU memory goes with the process (True); the next call starts a new child. Where all of
        it has ended nothing changes (False; what failed is left to `settle`). The profiles'
        warm-up beside the gate is ended so where the gate ends first
        (`tuner.search.children.Children.end_warm`)."""
        if not self.running():
            return False
        pool, self._pool, self._ahead = self._pool, None, []
        if pool is not None:
            # Terminated: `shutdown` alone waits for the call that runs. The pool's processes
            # are private (`ProcessPoolExecutor.terminate_workers` is Python 3.14's).
            for process in list(pool._processes.values()):
                process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
        return True

    def _failed_ahead(self) -> bool:
        """Whether anything started ahead failed (waited for here); forgotten once asked."""
        ahead, self._ahead = self._ahead, []
        return any(f.cancelled() or f.exception() is not None for f in ahead)

    def _started(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def close(self) -> None:
        self._ahead = []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
