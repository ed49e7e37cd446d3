# Issue 54 on one lent GPU (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call),
# after the first levers queue (docs/benchmarks/levers-h200-2026-11-29.md): its --config rows ran
# on the loop's default feed (batches made on the loop's thread, read every step), not the scale
# space's, so the peers' comparison said nothing. Each config here names the scale space's whole
# fixed feed (tuner/search/spaces/named.py, scale_space). First the kernels lever's GPU tests
# (liger beside each layer compiled is new), then at `llama-1b`, float8, each layer compiled,
# against the two fastest peers with the ablation: liger's kernels (whose fused loss stays
# eager), the compiled loss; the levers' probes at the same shapes (seconds: the prediction
# the rows check); then torchtitan with the block mask shimmed too. About 4 minutes a row; the
# time-to-answer queue (2026-11-30-tta-5.sh) can follow on the same machine.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
gpu=${QUEUE_GPU:-0}  # the GPU this queue runs on (a lane of a larger machine)
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers, importlib.metadata as m; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version(), m.version("liger-kernel"))' > "$QUEUE_OUT/versions.txt" 2>&1
CUDA_VISIBLE_DEVICES=$gpu python -m pytest -q -m gpu -p no:cacheprovider \
  tests/trainers/test_kernels_lever.py tests/trainers/test_attention_lever.py \
  tests/trainers/test_loss_lever.py -rA \
  --junitxml="$QUEUE_OUT/gpu-tests.xml" > "$QUEUE_OUT/gpu-tests.log" 2>&1
echo "gpu tests ended with $? at $(date -u +%T)"
peers=compile-fused,float8-compile
row=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --allow-precisions float8
  --peers $peers --rounds 2 --peer-protocol 4,8,4 --config-precision float8 --commit "$commit"
  --out "$QUEUE_OUT")
feed='"num_streams": 2, "sync_mode": "event", "sync_interval": 10, "prefetch_depth": 2, "pin_memory": true, "non_blocking": true, "num_workers": 2, "compile": "default", "optimizer": "fused", "compile_scope": "blocks"'
for lever in '"kernels": "liger"' '"loss": "compiled"'; do
  tag=$(echo "$lever" | tr -dc 'a-z' | sed 's/^kernels/kernels-/; s/^loss/loss-/')
  CUDA_VISIBLE_DEVICES=$gpu python benchmarks/peers.py "${row[@]}" --config "{$feed, $lever}" \
    --tag "levers-blocks-$tag" > "$QUEUE_OUT/levers-blocks-$tag.log" 2>&1
  echo "$tag row ended with $? at $(date -u +%T)"
done
# The levers' probes at the same shapes, against the step of the rows above (about 190 ms):
# what the second stage would keep, to set beside the rows' whole-step ablations.
CUDA_VISIBLE_DEVICES=$gpu python benchmarks/lever_probes.py --presets hf:causal-lm:llama-1b \
  --precision bf16-autocast --step-ms 190 --commit "$commit" --out "$QUEUE_OUT" \
  > "$QUEUE_OUT/lever-probes.log" 2>&1
echo "probes ended with $? at $(date -u +%T)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tt .whl-tt/*.whl
PYTHONPATH=/tmp/site-tt:$PYTHONPATH CUDA_VISIBLE_DEVICES=$gpu python benchmarks/torchtitan_row.py \
  --shim-torch --steps 30 --warmup 10 --out "$QUEUE_OUT/torchtitan-shimmed" > "$QUEUE_OUT/torchtitan-shimmed.log" 2>&1
echo "torchtitan shimmed ended with $? at $(date -u +%T)"
