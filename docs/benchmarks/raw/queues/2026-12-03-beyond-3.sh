# Issue 54's rows 5 and 6, on nvidia-h200-x2 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on
# the first call; STREAMTUNE_COMMIT the literal commit), one lane per GPU, each on half the host's
# cores (taskset; Inductor's compile workers as many) with Inductor and Triton caches of its own,
# empty (a user's first run). Each row is a default job (the CLI's 40 trials, no search timeout,
# the default profiles) that may choose float8, against the five scale peers, 2 rounds
# interleaved, with the ablation (`peers-*-beyond-*.json`, key `ablation`), as in
# 2026-12-01-beyond-1.sh and 2026-12-02-beyond-2.sh.
# GPU 0: the fourth held-out decoder, the Qwen1.5-0.5B shape (0.46B, vocabulary 151,936, tied;
# named in the note of 2026-11-30 before its first run; kv_heads=16: its attention has
# no grouped queries). GPU 1: `llama-1b-large` (the 1.1B preset at 16 x 2048 tokens).
# On one GPU (nvidia-h200, when no x2 is lent) the lane runs the Qwen1.5-0.5B-shape row alone.
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
largerow='python benchmarks/peers.py "${row[@]}" --presets hf:causal-lm:llama-1b-large --tag beyond-llama-1b-large > "$QUEUE_OUT/beyond-llama-1b-large.log" 2>&1'
if ((gpus >= 2)); then
  lane 0 "$qwenrow" &
  lanes=($!)
  lane 1 "$largerow" &
  lanes+=($!)
  for pid in "${lanes[@]}"; do wait "$pid"; done
else
  lane 0 "$qwenrow"
fi
