"""Build the LibTorch trainer against the torch installed in this Python: `python build.py`.

CMake finds LibTorch through `torch.utils.cmake_prefix_path`, so the binary links the same
libraries as the Python side (a CUDA wheel gives a CUDA trainer). The build goes to `build/`
beside this file (ignored by git); a second call rebuilds only what changed. Prints the
binary's path.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BINARY = "transformer_trainer"


def build(folder: Path = HERE / "build", *, jobs: int | None = None, quiet: bool = False) -> Path:
    """Configure (once) and build; the binary's path. RuntimeError naming what is missing."""
    import torch

    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cmake is not on PATH: install CMake >= 3.18 and a C++17 compiler")
    folder.mkdir(parents=True, exist_ok=True)
    # One build at a time in one folder (two test processes, say): the second waits, then
    # finds it built.
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        out = subprocess.DEVNULL if quiet else None
        if not (folder / "CMakeCache.txt").exists():
            subprocess.run(
                [
                    cmake,
                    "-S",
                    str(HERE),
                    "-B",
                    str(folder),
                    *generator,
                    "-DCMAKE_BUILD_TYPE=Release",
                    f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                    f"-DPython_EXECUTABLE={sys.executable}",
                    # CMake 4 refuses cmake_minimum_required below 3.5 in any config file it reads;
                    # older CMake ignores this variable.
                    "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
                ],
                check=True,
                stdout=out,
            )
        parallel = ["--parallel", str(jobs or os.cpu_count() or 1)]
        subprocess.run([cmake, "--build", str(folder), *parallel], check=True, stdout=out)
    return folder / BINARY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=Path, default=HERE / "build")
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args()
    print(build(args.build_dir, jobs=args.jobs))


if __name__ == "__main__":
    main()
