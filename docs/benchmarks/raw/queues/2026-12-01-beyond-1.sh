# Issue 54's rows, the first two, on nvidia-h200-x2 (tools/device_queue.sh; carry [".whl",
# ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit), one lane per GPU, each on
# half the host's cores (taskset; Inductor's compile workers as many) with Inductor and Triton
# caches of its own, empty (a user's first run). Each row is a default job (the CLI's 40 trials,
# no search timeout, the default profiles) that may choose float8, against the five scale peers,
# 2 rounds interleaved, with the ablation (`peers-*-beyond-*.json`, key `ablation`). Since
# 2026-11-30 the built-in spaces offer the float8 head, which the second stage tries on a float8
# leader where its probe predicts a gain (whole-step 1.047x on the Qwen2-style decoder, 1.019x at
# `llama-1b`); this is the first default job with it.
# GPU 0: the float8 head's GPU tests (its probe), then `llama-1b`. GPU 1: the first held-out
# decoder, the Llama-3.2-1B shape (1.24B, vocabulary 128,256, tied; named in the note of
# 2026-11-30 before this run, with the other three: the GPT-2-large shape, the Pythia-1B shape and
# the Qwen1.5-0.5B shape).
# On one GPU (nvidia-h200, when no x2 is lent) the lane runs the tests and the held-out row alone.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --allow-precisions float8
  --trials 40 --profile baselines --peers $peers --rounds 2 --peer-protocol 4,8,4
  --commit "$commit" --out "$QUEUE_OUT")
llama32=(--model-arg arch=llama --model-arg hidden=2048 --model-arg layers=16 --model-arg heads=32
  --model-arg kv_heads=8 --model-arg ffn=8192 --model-arg vocab=128256 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
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
tests='python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_head_lever.py -rA --junitxml="$QUEUE_OUT/gpu-tests.xml" > "$QUEUE_OUT/gpu-tests.log" 2>&1'
llama1b='python benchmarks/peers.py "${row[@]}" --tag beyond-llama-1b > "$QUEUE_OUT/beyond-llama-1b.log" 2>&1'
llama32row='python benchmarks/peers.py "${row[@]}" "${llama32[@]}" --tag beyond-llama3.2-1b > "$QUEUE_OUT/beyond-llama3.2-1b.log" 2>&1'
if ((gpus >= 2)); then
  lane 0 "$tests" "$llama1b" &
  lanes=($!)
  lane 1 "$llama32row" &
  lanes+=($!)
  for pid in "${lanes[@]}"; do wait "$pid"; done
else
  # One GPU (nvidia-h200 when no x2 was lent): the held-out row, the one never measured, on the
  # whole host; `llama-1b` waits for the next machine.
  lane 0 "$tests" "$llama32row"
fi
