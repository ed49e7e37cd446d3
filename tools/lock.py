"""Make `requirements.lock`: every runtime and dev dependency of streamtune at an exact version.

    python tools/lock.py            # re-resolve after editing pyproject.toml's dependencies
    python tools/lock.py --upgrade  # also move every pin to the newest release the ranges allow

The resolver is uv's pip-compatible `uv pip compile` (pinned below), for CPython 3.11 on x86-64
Linux, with torch taken as the CPU build `2.13.0+cpu` (the build these machines install; the
GPU image brings its own torch and never installs it from the lock). Without `--upgrade`, the
pins already in the lock are kept wherever the ranges still allow them.

The lock's first line records a digest of pyproject.toml's dependency tables;
`tests/test_lock.py` fails when they no longer match, so a range changed without re-locking
cannot land.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
UV = "uv==0.13.9"
TORCH_CPU = "torch==2.13.0+cpu"
DIGEST_PREFIX = "# pyproject-dependencies-sha256: "


def pyproject_digest(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """A digest of what the lock is resolved from: Python range, dependencies and extras."""
    project = tomllib.loads(pyproject.read_text())["project"]
    tables = {"requires-python": project.get("requires-python"),
              "dependencies": sorted(project.get("dependencies", [])),
              "optional-dependencies": {k: sorted(v) for k, v in
                                        sorted(project.get("optional-dependencies", {}).items())}}
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()


def uv_command() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", UV], check=True)
    return [sys.executable, "-m", "uv"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upgrade", action="store_true", help="move every pin to the newest")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        override = Path(tmp) / "override.txt"
        override.write_text(TORCH_CPU + "\n")
        out = Path(tmp) / "requirements.lock"
        if LOCK.exists() and not args.upgrade:
            # uv keeps the versions an existing output file already pins, where still allowed.
            out.write_text(LOCK.read_text())
        command = [*uv_command(), "pip", "compile", "pyproject.toml", "--all-extras",
                   "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
                   "--override", str(override), "--no-annotate",
                   "--custom-compile-command", "python tools/lock.py", "--quiet", "-o", str(out)]
        if Path("/opt/wheels").is_dir():  # where these machines keep the CPU torch wheel
            command += ["--find-links", "/opt/wheels"]
        if args.upgrade:
            command.append("--upgrade")
        subprocess.run(command, cwd=ROOT, check=True)
        body = out.read_text()
    LOCK.write_text(f"{DIGEST_PREFIX}{pyproject_digest()}\n{body}")
    print(f"wrote {LOCK.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
