#!/usr/bin/env bash
# Download what the README's GPU install (`pip install -c requirements-keep-torch.lock .`) adds to
# a machine that has its own CUDA torch, for the lent GPU machine (Python 3.12 on x86-64 Linux, no
# package index): the locked pins of streamtune's runtime dependencies, less torch and its own
# stack. About 81 MB, in two folders under the 64 MiB a device call carries, each carried on its
# own call (ignored folders stay on a warm machine between calls):
#
#   tools/keep_torch_wheels.sh           # here: .whl-keep/a and .whl-keep/b
#   # call 1 carries .whl-keep/a, call 2 (within 30 s) carries .whl-keep/b and runs
#   STREAMTUNE_WHEELHOUSE=.whl-keep/a:.whl-keep/b python -m pytest -m gpu tests/test_lock.py
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
# The two largest (scipy, numpy) in a, the rest in b.
mkdir -p .whl-keep/a .whl-keep/b
mv .whl-keep/all/scipy-* .whl-keep/all/numpy-* .whl-keep/a/
mv .whl-keep/all/* .whl-keep/b/
rmdir .whl-keep/all
du -sh .whl-keep/a .whl-keep/b
