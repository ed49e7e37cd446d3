"""The constraints of a GPU user's install: `requirements.lock` without torch and what only
torch pins, so that a CUDA build of torch already installed is kept and everything else is
installed at the lock's versions:

    pip install -c requirements-keep-torch.lock .   # the README's command, torch kept as it is
    python tools/lock_without_torch.py               # rewrite it after tools/lock.py

The lock pins torch's CPU build (`+cpu`), which pip would otherwise install over a CUDA build;
sympy is pinned exactly by each torch release, so the lock's pin can conflict with the user's
torch (mpmath and networkx go with it); setuptools is bounded by some (torch 2.11 on Python 3.12:
setuptools<82, against the lock's 84: the GPU image's test failed on it, 2026-11-29).
tests/test_lock.py checks the file is current.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
KEEP_TORCH = ROOT / "requirements-keep-torch.lock"
TORCH_OWN = ("torch", "sympy", "mpmath", "networkx", "triton", "setuptools")
HEADER = "# requirements.lock less torch's own pins, by python tools/lock_without_torch.py\n"


def without_torch(lock: str) -> str:
    """The lock's pins, less those of TORCH_OWN, under a header naming this tool."""
    kept = []
    for line in lock.splitlines(keepends=True):
        name = re.split(r"[=<>!~\[ ;]", line.strip(), maxsplit=1)[0].lower()
        if line.startswith("#") or name not in TORCH_OWN:
            kept.append(line)
    return HEADER + "".join(kept)


def main() -> None:
    KEEP_TORCH.write_text(without_torch(LOCK.read_text()))
    print(f"wrote {KEEP_TORCH.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
