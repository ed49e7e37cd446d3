# Issues 54 and 55 on nvidia-h200-x2 or nvidia-h200 (tools/device_queue.sh; carry [".whl",
# ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit), one lane per GPU, each on
# its share of the host's cores with Inductor and Triton caches of its own, empty.
# GPU 0: issue 54's fifth row again, the Qwen1.5-0.5B shape, a default job. At 4a59f53 (one
#   H200, 2026-11-30) it reached 1.05x (1.04-1.06) the fastest peer in 1,025 s of tuning: its
#   final round gated a second tied config (117 s) and ran a second round (114 s), and its two
#   float8 finalists (float8_linears all and none: two reuse keys) compiled again at every turn
#   (28-59 s each). Now the final round keeps the job's 900 s aim (tuner/search/deciding/aim.py)
#   and keeps each finalist's compiled code beside the others' (keeping_compiled).
# GPU 1: first the GPU proof that Dynamo's guards keep float8 and bf16 entries apart when both
#   are kept (tests/trainers/test_float8_gpu.py), then issue 54's second row again, the
#   Llama-3.2-1B shape (vocabulary 128,256), a default job (901 s at b58d9ad).
# On one GPU (nvidia-h200) the lane runs the GPU test, then GPU 0's row. The test compiles into
# caches of its own, so the row starts with empty ones.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --allow-precisions float8
  --trials 40 --profile baselines --peers $peers --rounds 2 --peer-protocol 4,8,4
  --commit "$commit" --out "$QUEUE_OUT" --model-arg seq=2048 --model-arg batch=8)
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true)
llama32=(--model-arg arch=llama --model-arg hidden=2048 --model-arg layers=16 --model-arg heads=32
  --model-arg kv_heads=8 --model-arg ffn=8192 --model-arg vocab=128256 --model-arg tie=true)
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
qwenrow='python benchmarks/peers.py "${row[@]}" "${qwen15[@]}" --tag beyond-qwen1.5-0.5b > "$QUEUE_OUT/beyond-qwen1.5-0.5b.log" 2>&1'
llama32row='python benchmarks/peers.py "${row[@]}" "${llama32[@]}" --tag beyond-llama3.2-1b > "$QUEUE_OUT/beyond-llama3.2-1b.log" 2>&1'
keeptest='TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor-test TRITON_CACHE_DIR=/tmp/queue/triton-test python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_gpu.py -k "side_by_side or keeps_the_float8" -rA --junitxml="$QUEUE_OUT/gpu-tests.xml" > "$QUEUE_OUT/gpu-tests.log" 2>&1'
if ((gpus >= 2)); then
  lane 0 "$qwenrow" &
  lanes=($!)
  lane 1 "$keeptest" "$llama32row" &
  lanes+=($!)
  for pid in "${lanes[@]}"; do wait "$pid"; done
else
  lane 0 "$keeptest" "$qwenrow"
fi
