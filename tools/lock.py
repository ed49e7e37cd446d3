"""Make the locks: every runtime, dev and model dependency of streamtune at an exact version.

    python tools/lock.py            # re-resolve after editing pyproject.toml's dependencies
    python tools/lock.py --upgrade  # also move every pin to the newest release the ranges allow

Two locks, for CPython 3.11 on x86-64 Linux, resolved by uv's pip-compatible `uv pip compile`
(pinned below):
- `requirements.lock`: the package and its `dev` and `float8` extras, with torch as the CPU build
  `2.13.0+cpu` (the build these machines install from disk; the README's two commands use this
  lock; torchao, the `float8` extra, is pinned here for the GPU image and `tools/gpu_wheels.sh`);
- `requirements-models.lock`: the same plus the `models` extra (torchvision, timm,
  transformers) and the `kernels` extra (liger-kernel; its Triton comes with torch's CUDA
  build). PyPI's torchvision does not import beside the CPU torch 2.13.0 build, so this
  lock takes torch 2.14.1 with torchvision 0.29.1, and the CUDA libraries at the versions these
  machines keep in their local package index (listed first, so uv takes a package from it when
  it has one). The model adapters' tests run in a venv of this lock (`.ci/run`).
Without `--upgrade`, the pins already in a lock are kept wherever the ranges still allow them.
The GPU image brings its own torch and never installs it from a lock (`tools/gpu_wheels.sh`).

Each lock's first line records a digest of pyproject.toml's dependency tables;
`tests/test_lock.py` fails when they no longer match, so a range changed without re-locking
cannot land.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UV = "uv==0.13.9"
LOCAL_INDEX = Path("/opt/pypi-more/simple")  # these machines' disk: torch's CUDA builds


@dataclasses.dataclass(frozen=True)
class Lock:
    path: Path
    extras: tuple[str, ...]
    overrides: tuple[str, ...]
    local_index: bool = False


LOCK = ROOT / "requirements.lock"
MODELS_LOCK = ROOT / "requirements-models.lock"
LOCKS = (
    Lock(LOCK, ("dev", "float8", "kernels"), ("torch==2.13.0+cpu",)),
    Lock(
        MODELS_LOCK,
        ("dev", "models", "float8", "kernels"),
        ("torch==2.14.1", "torchvision==0.29.1"),
        local_index=True,
    ),
)
DIGEST_PREFIX = "# pyproject-dependencies-sha256: "


def pyproject_digest(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """A digest of what the lock is resolved from: Python range, dependencies and extras."""
    project = tomllib.loads(pyproject.read_text())["project"]
    tables = {
        "requires-python": project.get("requires-python"),
        "dependencies": sorted(project.get("dependencies", [])),
        "optional-dependencies": {
            k: sorted(v) for k, v in sorted(project.get("optional-dependencies", {}).items())
        },
    }
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()


def uv_command() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", UV], check=True)
    return [sys.executable, "-m", "uv"]


def write(lock: Lock, *, upgrade: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        override = Path(tmp) / "override.txt"
        override.write_text("\n".join(lock.overrides) + "\n")
        out = Path(tmp) / lock.path.name
        if lock.path.exists() and not upgrade:
            # uv keeps the versions an existing output file already pins, where still allowed.
            out.write_text(lock.path.read_text())
        command = [
            *uv_command(),
            "pip",
            "compile",
            "pyproject.toml",
            *(arg for extra in lock.extras for arg in ("--extra", extra)),
            "--python-version",
            "3.11",
            "--python-platform",
            "x86_64-manylinux_2_28",
            "--override",
            str(override),
            "--no-annotate",
            "--quiet",
            "--custom-compile-command",
            "python tools/lock.py",
            "-o",
            str(out),
        ]
        if Path("/opt/wheels").is_dir():  # where these machines keep the CPU torch wheel
            command += ["--find-links", "/opt/wheels"]
        if lock.local_index:
            if not LOCAL_INDEX.is_dir():
                raise SystemExit(
                    f"{lock.path.name} is resolved against {LOCAL_INDEX}, which this machine lacks"
                )
            command += ["--index", LOCAL_INDEX.as_uri()]
        if upgrade:
            command.append("--upgrade")
        subprocess.run(command, cwd=ROOT, check=True)
        body = out.read_text()
    lock.path.write_text(f"{DIGEST_PREFIX}{pyproject_digest()}\n{body}")
    print(f"wrote {lock.path.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upgrade", action="store_true", help="move every pin to the newest")
    args = parser.parse_args()
    for lock in LOCKS:
        write(lock, upgrade=args.upgrade)


if __name__ == "__main__":
    main()
