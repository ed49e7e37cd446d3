# Issue 54 on one GPU of a lent machine (a lane of 2026-11-30-lanes.sh): what converting the
# output head to float8 (`float8_head=float8`, trainers/levers/float8_head.py) gives a float8 step
# and whether the gate passes it, before the scale space offers it. The head is the largest
# single matmul at a large vocabulary, and the float8 recipes (and the float8 peers) keep it in
# bf16. Models: the Qwen2-style 0.49B decoder (vocabulary 151,936) and `llama-1b` (32,000), both
# used before; the new held-out decoders are kept out of this development run.
# 1. the lever's GPU tests;
# 2. per model, the float8 step with the whole model compiled and the head in float8, against the
#    fastest peer (float8-compile, which is the same step with the head in bf16), 2 rounds
#    interleaved, with the ablation (the same config with float8_head=bf16);
# 3. per model, the gate on that config as a default job runs it (20 steps against the bf16
#    reference's seed-to-seed envelope, the eager twin);
# 4. each layer compiled with the loss compiled and the head in float8, the same comparison.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
gpu=${QUEUE_GPU:-0}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
CUDA_VISIBLE_DEVICES=$gpu python -m pytest -q -m gpu -p no:cacheprovider \
  tests/trainers/test_float8_head_lever.py -rA --junitxml="$QUEUE_OUT/gpu-tests-float8-head.xml" \
  > "$QUEUE_OUT/gpu-tests-float8-head.log" 2>&1
echo "gpu tests ended with $? at $(date -u +%T)"
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
llama=()
feed='"num_streams": 2, "sync_mode": "event", "sync_interval": 10, "prefetch_depth": 2, "pin_memory": true, "non_blocking": true, "num_workers": 2, "compile": "default", "optimizer": "fused"'
whole="{$feed, \"compile_scope\": \"model\", \"float8_head\": \"float8\"}"
blocks="{$feed, \"compile_scope\": \"blocks\", \"loss\": \"compiled\", \"float8_head\": \"float8\"}"
row() {  # model, config, tag
  declare -n margs=$1
  CUDA_VISIBLE_DEVICES=$gpu python benchmarks/peers.py --presets hf:causal-lm:llama-1b "${margs[@]}" \
    --precisions bf16-autocast --allow-precisions float8 --peers float8-compile --rounds 2 \
    --peer-protocol 4,8,4 --config-precision float8 --config "$2" --commit "$commit" \
    --out "$QUEUE_OUT" --tag "$3" > "$QUEUE_OUT/$3.log" 2>&1
  echo "$3 ended with $? at $(date -u +%T)"
}
gate() {  # model, config, tag
  declare -n margs=$1
  CUDA_VISIBLE_DEVICES=$gpu python benchmarks/precision_gate.py --workload hf:causal-lm \
    --preset llama-1b "${margs[@]}" --precision bf16-autocast --config-precision float8 \
    --config "$2" --parity-steps 20 --precision-parity-steps 20 --commit "$commit" \
    --out "$QUEUE_OUT" --tag "$3" > "$QUEUE_OUT/gate-$3.log" 2>&1
  echo "gate $3 ended with $? at $(date -u +%T)"
}
row qwen2 "$whole" qwen2-model-head-float8
gate qwen2 "$whole" qwen2-model-head-float8
row llama "$whole" llama-1b-model-head-float8
gate llama "$whole" llama-1b-model-head-float8
row qwen2 "$blocks" qwen2-blocks-loss-head-float8
row llama "$blocks" llama-1b-blocks-loss-head-float8
