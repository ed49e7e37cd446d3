# Issues 54 and 55 on nvidia-h200-x2 or nvidia-h200 (tools/device_queue.sh; carry [".whl",
# ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit), one lane per GPU, each on
# its share of the host's cores with Inductor and Triton caches of its own, empty.
# GPU 0: issue 54's second row again, the Llama-3.2-1B shape (vocabulary 128,256), a default job
#   (901 s at b58d9ad), now with the final round's finalists keeping their compiled code side by
#   side (trainers.compilation.keeping_compiled; not yet seen in a real job: the Qwen1.5-0.5B row
#   at b553055 had one finalist) and the job's 900 s aim.
# GPU 1 (nvidia-h200-x2 only): issue 55's time to an answer on the Qwen2-style held-out decoder,
#   cold then repeat (docs/benchmarks/raw/queues/2026-11-30-tta-5.sh with TTA_ROWS=qwen2, no
#   tests): 671 s cold beside another lane's compiles at its last run.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --allow-precisions float8
  --trials 40 --profile baselines --peers $peers --rounds 2 --peer-protocol 4,8,4
  --commit "$commit" --out "$QUEUE_OUT" --model-arg seq=2048 --model-arg batch=8)
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
llama32row='python benchmarks/peers.py "${row[@]}" "${llama32[@]}" --tag beyond-llama3.2-1b > "$QUEUE_OUT/beyond-llama3.2-1b.log" 2>&1'
tta='TTA_GPU_TESTS=none TTA_ROWS=qwen2 QUEUE_GPU=1 bash docs/benchmarks/raw/queues/2026-11-30-tta-5.sh > "$QUEUE_OUT/tta-lane.log" 2>&1'
if ((gpus >= 2)); then
  lane 0 "$llama32row" &
  lanes=($!)
  lane 1 "$tta" &
  lanes+=($!)
  for pid in "${lanes[@]}"; do wait "$pid"; done
else
  lane 0 "$llama32row"
fi
