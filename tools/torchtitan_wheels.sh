#!/usr/bin/env bash
# Download into .whl-tt/ the wheels benchmarks/torchtitan_row.py needs on the lent GPU machine
# (Python 3.12, x86-64 Linux, no package index) beyond what its image has (torch, torchao 0.18,
# transformers and so tokenizers, jinja2, numpy), and print their total size (about 1.8 MB).
#
#   tools/torchtitan_wheels.sh     # here, with PyPI reachable; PYTHON=... picks the pip
#   # then on the GPU machine (carry .whl-tt: it ignores itself, so git does not list it):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl-tt/*.whl
#   PYTHONPATH=/tmp/site:$PWD python3 benchmarks/torchtitan_row.py --out DIR
#
# Each wheel is here because torchtitan 0.3.0 imports it at module level on the script's path
# (import torchtitan.trainer, torchtitan.models.llama3, the float8 converter); all are pure Python.
# Left out on purpose, though torchtitan's metadata asks for them:
#   datasets (+ pyarrow, pandas, dill, multiprocess, xxhash: over 60 MB): imported at module level
#     (components/validate.py -> hf_datasets/text_datasets.py) but never called here; the script
#     stubs it where it is missing and feeds torchtitan's dataset a list;
#   tensorboard (+ protobuf, grpcio, tensorboard-data-server, absl-py, markdown, werkzeug):
#     `from torch.utils.tensorboard import SummaryWriter` in components/metrics.py, never called
#     with TensorBoard off; stubbed the same way;
#   wandb (imported only when enabled), einops, torch_checkpointing, safetensors, pillow (not
#     imported on this path), tokenizers (the image's transformers needs it).
set -euo pipefail
cd "$(dirname "$0")/.."
pins=(
  torchtitan==0.3.0         # the package itself (1.3 MB)
  tyro==1.0.17              # config/manager.py, trainer.py, hf_datasets/text_datasets.py
  docstring-parser==0.18.0  # tyro's
  typeguard==4.6.1          # tyro's
  typing-extensions==4.16.0 # typeguard needs >= 4.14; newer than the image's is harmless
  spmd-types==0.2.3         # trainer.py `import spmd_types` (torchtitan pins exactly 0.2.3)
  torchdata==0.11.0         # components/dataloader.py StatefulDataLoader (0.3.0's release pin)
)
rm -rf .whl-tt && mkdir -p .whl-tt
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl-tt "${pins[@]}"
printf '*\n' > .whl-tt/.gitignore
bytes=$(cat .whl-tt/*.whl | wc -c)
echo "$(ls .whl-tt/*.whl | wc -l) wheels in .whl-tt/: $bytes bytes ($((bytes / 1024)) KiB)"
