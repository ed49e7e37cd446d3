#!/usr/bin/env bash
# Download the locked wheels a GPU run needs into .whl/ (ignored by git), for the lent GPU machine:
# Python 3.12 on x86-64 Linux, no package index. Versions come from requirements.lock, so a GPU
# run installs exactly what CI tested.
#
#   tools/gpu_wheels.sh            # here, with PyPI reachable
#   # then, in the device command (carry .whl):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#
# Left out on purpose: the GPU image's own CUDA stack (torch and what it needs: numpy, scipy,
# sympy, networkx, jinja2, filelock, fsspec, triton, nvidia-*) and the dev-only linters and
# fuzzers (ruff, mypy, schemathesis, hadolint): replacing torch's numpy would test a stack the
# image does not have, and the whole tree travels in 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
needs=(
  # the tuner and its storage
  optuna alembic sqlalchemy colorlog mako markupsafe tqdm pyyaml packaging
  pydantic pydantic-core pydantic-settings python-dotenv typing-inspection annotated-types
  typer click rich shellingham markdown-it-py mdurl pygments plotly narwhals
  psycopg psycopg-binary
  # the service (API tests run on the GPU too)
  fastapi starlette anyio idna h11 uvicorn annotated-doc opentelemetry-api
  # the test runner
  pytest pluggy iniconfig hypothesis sortedcontainers httpx httpcore certifi
  # the float8 precision (trainers/float8.py): one cp310-abi3 wheel, no dependency beyond torch
  torchao
  # the kernels lever (trainers/levers/kernels.py): pure Python; its Triton is the image's torch's
  liger-kernel
)
pins=()
for name in "${needs[@]}"; do
  line=$(grep -i -E "^${name}==" requirements.lock || true)
  [ -n "$line" ] || { echo "tools/gpu_wheels.sh: $name is not in requirements.lock" >&2; exit 1; }
  pins+=("$line")
done
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${pins[@]}"
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
