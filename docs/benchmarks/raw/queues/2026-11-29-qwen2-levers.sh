# Issue 54 on one lent GPU after the lanes queue (2026-12-01-lanes.sh, run 2026-11-29 at
# 6df068c): about 8 minutes (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call).
# 1. torchtitan's own row with its whole-step CUDA graph off: on, its first backward failed on
#    torch 2.11 ("data is not allocated yet", torchtitan/distributed/cudagraph.py).
# 2. The levers' probes at the Qwen2-style held-out decoder's shapes (vocabulary 151,936, hidden
#    896), where the loss region is the largest share of the step.
# 3. That decoder at its own pick (float8, compiled) with each layer compiled and the loss
#    compiled, against the two fastest peers, with the ablation.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
gpu=${QUEUE_GPU:-0}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tt .whl-tt/*.whl
PYTHONPATH=/tmp/site-tt:$PYTHONPATH CUDA_VISIBLE_DEVICES=$gpu python benchmarks/torchtitan_row.py \
  --shim-torch --cuda-graphs off --steps 30 --warmup 10 --out "$QUEUE_OUT/torchtitan-no-graphs" \
  > "$QUEUE_OUT/torchtitan-no-graphs.log" 2>&1
echo "torchtitan ended with $? at $(date -u +%T)"
qwen2=(arch=qwen2 hidden=896 layers=24 heads=14 kv_heads=2 ffn=4864 vocab=151936 tie=true seq=2048 batch=8)
margs=()
for kv in "${qwen2[@]}"; do margs+=(--model-arg "$kv"); done
CUDA_VISIBLE_DEVICES=$gpu python benchmarks/lever_probes.py --presets hf:causal-lm:llama-1b \
  "${margs[@]}" --precision bf16-autocast --step-ms 122 --commit "$commit" --out "$QUEUE_OUT" \
  --tag qwen2 > "$QUEUE_OUT/lever-probes-qwen2.log" 2>&1
echo "probes ended with $? at $(date -u +%T)"
feed='"num_streams": 2, "sync_mode": "event", "sync_interval": 10, "prefetch_depth": 2, "pin_memory": true, "non_blocking": true, "num_workers": 2, "compile": "default", "optimizer": "fused", "compile_scope": "blocks"'
CUDA_VISIBLE_DEVICES=$gpu python benchmarks/peers.py --presets hf:causal-lm:llama-1b "${margs[@]}" \
  --precisions bf16-autocast --allow-precisions float8 --peers compile-fused,float8-compile \
  --rounds 2 --peer-protocol 4,8,4 --config-precision float8 --commit "$commit" --out "$QUEUE_OUT" \
  --config "{$feed, \"loss\": \"compiled\"}" --tag qwen2-blocks-loss-compiled \
  > "$QUEUE_OUT/qwen2-blocks-loss-compiled.log" 2>&1
echo "qwen2 row ended with $? at $(date -u +%T)"
