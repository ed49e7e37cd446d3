# Issue 54 on one lent GPU (tools/device_queue.sh), before any lever is offered to the search:
# first the GPU tests of the lever modules that have never run on a GPU (float8_head, kernels),
# then what each gives at `llama-1b` over the pick every 1B job has made so far (float8, the whole
# model compiled, fused AdamW: 44.9 samples/s on one H200 at c8b23c3), measured against two
# peers with the ablation (`without-<lever>`, each lever set back to its default), interleaved in
# one process:
# - kernels=liger beside the whole-model compile (liger's fused linear cross-entropy, RMSNorm
#   and SwiGLU inside Inductor's graph);
# - loss=compiled and kernels=torch under each-layer compilation, the fastest loop on some models
#   (the head and the loss compiled too), in float8 and with the head kept in bf16.
# A few minutes a row on an H200 (no tuning job: --config).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers, importlib.metadata as m; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version(), m.version("liger-kernel"))' > "$QUEUE_OUT/versions.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/trainers/test_float8_head_lever.py tests/trainers/test_kernels_lever.py -rA \
  --junitxml="$QUEUE_OUT/gpu-tests.xml" > "$QUEUE_OUT/gpu-tests.log" 2>&1
echo "gpu tests ended with $? at $(date -u +%T)"
# Screening rows, not the issue's rows: the two peers that were fastest at `llama-1b` (bf16 and
# float8, the whole model compiled), so each row is a few minutes; the rows run the five.
peers=compile-fused,float8-compile
row=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --allow-precisions float8
  --peers $peers --rounds 2 --peer-protocol 4,8,4 --config-precision float8 --commit "$commit"
  --out "$QUEUE_OUT")
liger='{"compile": "default", "optimizer": "fused", "kernels": "liger"}'
CUDA_VISIBLE_DEVICES=0 python benchmarks/peers.py "${row[@]}" --config "$liger" \
  --tag levers-liger > "$QUEUE_OUT/levers-liger.log" 2>&1
echo "liger row ended with $? at $(date -u +%T)"
blocks='{"compile": "default", "compile_scope": "blocks", "optimizer": "fused", "loss": "compiled"}'
CUDA_VISIBLE_DEVICES=0 python benchmarks/peers.py "${row[@]}" --config "$blocks" \
  --tag levers-blocks-loss > "$QUEUE_OUT/levers-blocks-loss.log" 2>&1
echo "blocks-loss row ended with $? at $(date -u +%T)"
# The real torchtitan 0.3.0 as the reference row (issue 54, item 4): its own Llama at
# `llama-1b`'s shape, float8 tensorwise and its compile, one GPU (benchmarks/torchtitan_row.py;
# its wheels from tools/torchtitan_wheels.sh travel in .whl-tt: carry [".whl", ".whl-tt"] on the
# first call). First as installed (torchtitan 0.3.0 targets torch 2.14 and imports a name torch
# 2.11 lacks: the record then holds that ImportError), then with the one missing name shimmed.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tt .whl-tt/*.whl
PYTHONPATH=/tmp/site-tt:$PYTHONPATH CUDA_VISIBLE_DEVICES=0 python benchmarks/torchtitan_row.py \
  --steps 30 --warmup 10 --out "$QUEUE_OUT/torchtitan-as-installed" > "$QUEUE_OUT/torchtitan-as-installed.log" 2>&1
echo "torchtitan as installed ended with $? at $(date -u +%T)"
PYTHONPATH=/tmp/site-tt:$PYTHONPATH CUDA_VISIBLE_DEVICES=0 python benchmarks/torchtitan_row.py \
  --shim-torch --steps 30 --warmup 10 --out "$QUEUE_OUT/torchtitan-shimmed" > "$QUEUE_OUT/torchtitan-shimmed.log" 2>&1
echo "torchtitan shimmed ended with $? at $(date -u +%T)"
# Last, where the machine's time still holds them (each a longer compile): the float8 pick with
# Inductor's GEMM autotuning, and with the step's launches captured (reduce-overhead: cudagraph
# trees over the compiled float8 step).
for mode in max-autotune-no-cudagraphs reduce-overhead; do
  CUDA_VISIBLE_DEVICES=0 python benchmarks/peers.py "${row[@]}" \
    --config "{\"compile\": \"$mode\", \"optimizer\": \"fused\"}" \
    --tag "levers-$mode" > "$QUEUE_OUT/levers-$mode.log" 2>&1
  echo "$mode row ended with $? at $(date -u +%T)"
done
