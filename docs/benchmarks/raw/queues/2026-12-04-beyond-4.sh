# Issue 54 on nvidia-h200-x2 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit), one lane per GPU, each on half the host's cores with
# Inductor and Triton caches of its own, empty.
# GPU 0: the `float8_linears` lever (trainers/levers/float8_linears.py, not yet run on a GPU):
#   1. its GPU tests;
#   2. at `llama-1b`, float8 with the whole model compiled, the head in float8 and only the
#      linears of 8M elements or more in float8 (the MLP's; the attention's projections in bf16),
#      against the `float8 + compile` peer, 2 rounds interleaved, with the ablation (each lever
#      module's lever back at its default: float8_linears=all is the 2026-11-30 recommendation);
#   3. issue 54's fifth row, the Qwen1.5-0.5B shape (held out, named 2026-11-30; kv_heads=16),
#      a default job as in 2026-12-03-beyond-3.sh;
#   4. the Pythia-1B shape's config with float8_linears=8M (its 2048 x 2048 dense in bf16), as 2.
# GPU 1: issue 54's sixth row, `llama-1b-large`, a default job (whose search now offers
#   float8_linears=8M).
# On one GPU (nvidia-h200) the lane runs 1-3.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--precisions bf16-autocast --allow-precisions float8
  --trials 40 --profile baselines --peers $peers --rounds 2 --peer-protocol 4,8,4
  --commit "$commit" --out "$QUEUE_OUT")
qwen15=(--presets hf:causal-lm:llama-1b --model-arg seq=2048 --model-arg batch=8
  --model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true)
pythia=(--model-arg seq=2048 --model-arg batch=8 --model-arg arch=gpt_neox --model-arg hidden=2048
  --model-arg layers=16 --model-arg heads=8 --model-arg kv_heads=0 --model-arg ffn=8192
  --model-arg vocab=50304)
feed='"num_streams": 2, "sync_mode": "event", "sync_interval": 10, "prefetch_depth": 2, "pin_memory": true, "non_blocking": true, "num_workers": 2, "compile": "default", "optimizer": "fused"'
large="{$feed, \"compile_scope\": \"model\", \"float8_head\": \"float8\", \"float8_linears\": \"8M\"}"
config=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --allow-precisions float8
  --peers float8-compile --rounds 2 --peer-protocol 4,8,4 --config-precision float8
  --config "$large" --commit "$commit" --out "$QUEUE_OUT")
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
lane() {  # GPU, then the commands of the lane (one string each)
  local gpu=$1 cores=$(( $(nproc) / gpus ))
  shift
  taskset -cp "$((gpu * cores))-$((gpu * cores + cores - 1))" $BASHPID > /dev/null
  export CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_COMPILE_THREADS=$cores
  export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor-$gpu TRITON_CACHE_DIR=/tmp/queue/triton-$gpu
  for command in "$@"; do
    eval "$command"
    echo "lane $gpu: '${command:0:60}' ended with $? at $(date -u +%T)"
  done
}
tests='python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_linears_lever.py -rA --junitxml="$QUEUE_OUT/gpu-tests.xml" > "$QUEUE_OUT/gpu-tests.log" 2>&1'
llama8m='python benchmarks/peers.py "${config[@]}" --tag llama-1b-model-head-float8-linears-8m > "$QUEUE_OUT/llama-1b-model-head-float8-linears-8m.log" 2>&1'
pythia8m='python benchmarks/peers.py "${config[@]}" "${pythia[@]}" --tag pythia-1b-model-head-float8-linears-8m > "$QUEUE_OUT/pythia-1b-model-head-float8-linears-8m.log" 2>&1'
qwenrow='python benchmarks/peers.py "${row[@]}" "${qwen15[@]}" --tag beyond-qwen1.5-0.5b > "$QUEUE_OUT/beyond-qwen1.5-0.5b.log" 2>&1'
largerow='python benchmarks/peers.py "${row[@]}" --presets hf:causal-lm:llama-1b-large --tag beyond-llama-1b-large > "$QUEUE_OUT/beyond-llama-1b-large.log" 2>&1'
if ((gpus >= 2)); then
  lane 0 "$tests" "$llama8m" "$qwenrow" "$pythia8m" &
  lanes=($!)
  lane 1 "$largerow" &
  lanes+=($!)
  for pid in "${lanes[@]}"; do wait "$pid"; done
else
  lane 0 "$tests" "$llama8m" "$qwenrow"
fi
