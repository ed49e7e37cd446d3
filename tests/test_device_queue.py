"""tools/device_queue.sh: a queue started in one call runs on detached and its results come back
in the next call's result folder, from a private copy of the tree."""

from __future__ import annotations

import os
import subprocess
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "device_queue.sh"


def _run(tree: Path, out: Path, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"OUT": str(out), "QUEUE_STATE": str(state), "QUEUE_POLL_S": "0.2"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=tree, env=env, capture_output=True, text=True, timeout=60
    )


def _result(out: Path, name: str) -> str:
    with tarfile.open(out / "queue.tar.gz") as archive:
        member = archive.extractfile(f"./{name}")
        assert member is not None
        return member.read().decode()


def test_a_queue_outlives_its_call_and_the_next_call_collects_it(tmp_path: Path) -> None:
    tree, state = tmp_path / "tree", tmp_path / "state"
    tree.mkdir()
    (tree / "queue.sh").write_text(
        # Waits for a file the test writes after the first call has returned.
        'echo "first $PWD" > "$QUEUE_OUT/first.txt"\n'
        f"while [ ! -f {tmp_path}/go ]; do sleep 0.1; done\n"
        'echo second > "$QUEUE_OUT/second.txt"\n'
    )
    first = _run(tree, tmp_path / "out1", state, "start", "queue.sh", "1")
    assert first.returncode == 3, first.stderr  # still running when the call's time is up
    assert "call 'wait' again" in first.stdout
    assert _result(tmp_path / "out1", "first.txt") == f"first {state / 'repo'}\n"
    # A second start on the same machine is refused: one queue per machine.
    again = _run(tree, tmp_path / "out2", state, "start", "queue.sh", "1")
    assert again.returncode == 2 and "use 'wait'" in again.stderr
    (tmp_path / "go").touch()
    deadline = time.monotonic() + 30
    while True:
        second = _run(tree, tmp_path / "out3", state, "wait", "5")
        if second.returncode == 0 or time.monotonic() > deadline:
            break
    assert second.returncode == 0, second.stdout + second.stderr
    assert "queue ended with exit code 0" in second.stdout
    assert _result(tmp_path / "out3", "second.txt") == "second\n"
    assert (tmp_path / "out3" / "queue.log").read_text() == ""  # the queue printed nothing


def test_wait_without_a_queue_says_so(tmp_path: Path) -> None:
    result = _run(tmp_path, tmp_path / "out", tmp_path / "none", "wait", "1")
    assert result.returncode == 2 and "no queue on this machine" in result.stderr
