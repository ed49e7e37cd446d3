#!/usr/bin/env bash
# Download what the README's GPU install (`pip install -c requirements-keep-torch.lock .`) adds to
# a machine that has its own CUDA torch, for the lent GPU machine (Python 3.12 on x86-64 Linux, no
# package index): the locked pins of streamtune's runtime dependencies, less torch and its own
# stack. About 83 MB, in folders that each fit beside the working tree in the 64 MiB a device
# call carries (three with a 21 MB tree, 2026-11-29: two of 50 and 33 MB did not), each carried
# on its own call (ignored folders stay on a warm machine between calls):
#
#   tools/keep_torch_wheels.sh           # here: .whl-keep/a, .whl-keep/b, ... (printed)
#   # each call (within 30 s of the last) carries the next folder; the last runs
#   STREAMTUNE_WHEELHOUSE=.whl-keep/a:.whl-keep/b:.whl-keep/c python -m pytest --noconftest \
#     -m gpu tests/test_lock.py
#
# The pins are resolved here, from the lock, by pip's own resolver (a dry run of the command for
# Python 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
report=$(mktemp)
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# Resolved for the GPU machine's Python, not this one's (markers differ by version): pip takes a
# target Python only with --target, which a dry run never writes to.
python3 -m pip install -q --dry-run --ignore-installed --target "$(mktemp -d)" \
  --python-version 3.12 --only-binary=:all: "${platforms[@]}" --report "$report" \
  -c requirements-keep-torch.lock . >/dev/null
pins=$(python3 - "$report" <<'PY'
import json, sys
stack = ("torch", "triton", "sympy", "mpmath", "networkx", "streamtune")
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name.lower() in stack or name.lower().startswith(("nvidia-", "cuda-")):
        continue  # the image's own CUDA stack, kept
    print(f"{name}=={version}")
PY
)
rm -f "$report"
rm -rf .whl-keep && mkdir -p .whl-keep/all
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl-keep/all $pins
# The build backend `pip install .` builds the project with, in its isolated environment
# (pyproject.toml's build-system: setuptools, as locked, and wheel, pinned here: not in the lock).
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl-keep/all \
  "$(grep -E '^setuptools==' requirements.lock)" wheel==0.48.0
# Into folders a, b, ... each under what one device call carries beside the working tree (64 MiB
# in all): largest first, each wheel into the first folder it fits.
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
python3 - "$tree" <<'PY'
import pathlib, string, sys
budget = 64 * 2**20 - int(sys.argv[1]) - 2 * 2**20  # 2 MiB spare: files added before the call
wheels = sorted(pathlib.Path(".whl-keep/all").iterdir(), key=lambda p: -p.stat().st_size)
parts: list[list[pathlib.Path]] = []
for wheel in wheels:
    size = wheel.stat().st_size
    if size > budget:
        sys.exit(f"{wheel.name} ({size >> 20} MiB) does not fit beside the tree in one call")
    fits = [p for p in parts if sum(w.stat().st_size for w in p) + size <= budget]
    (fits[0] if fits else parts.append([]) or parts[-1]).append(wheel)
for letter, part in zip(string.ascii_lowercase, parts):
    folder = pathlib.Path(".whl-keep", letter)
    folder.mkdir()
    for wheel in part:
        wheel.rename(folder / wheel.name)
PY
rmdir .whl-keep/all
du -sh .whl-keep/*
echo "STREAMTUNE_WHEELHOUSE=$(ls -d .whl-keep/* | paste -sd:)"
