# Issue 55's loop twin on nvidia-h200-x2 or nvidia-h200 (tools/device_queue.sh; carry
# [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit): the gate's GPU
# tests first (the planted stream faults, now also under compiled configs checked through their
# loop twin), then issue 55's time to an answer on two held-out decoders, cold then repeat, whose
# gates now check a compiled config's loop settings on the eager model instead of compiling an
# eager twin under strict determinism. Each row: benchmarks/time_to_answer.py, a default job
# (float8 allowed) from empty Inductor and Triton caches and empty storage, then a repeat job in
# a new process with empty caches given only the first job's SQLite file and artefacts file,
# then one interleaved round of the two picks.
# GPU 0: the Qwen2-style decoder (0.49B, vocabulary 151,936; 671 s cold beside another lane's
#   compiles at its last run, 129 s repeat).
# GPU 1 (nvidia-h200-x2 only): the gate's GPU tests, then the Qwen1.5-0.5B shape, issue 54's
#   fifth held-out row (0.46B, vocabulary 151,936; its default job took 588 s from empty caches
#   on one H200 at b553055), never yet run as a repeat job. On one GPU the lane runs after the
#   first.
# Each lane on its share of the host's cores, with caches of its own.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
gate_tests() {  # the gate's GPU tests, with caches of the lane's own
  python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py -rA \
    --junitxml="$QUEUE_OUT/gate_gpu.xml" > "$QUEUE_OUT/gate_gpu.log" 2>&1
}
tta() {  # the row's name (an array above)
  local -n margs=$1
  local passed
  mapfile -t passed < <(as_job "${margs[@]}")
  python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
    --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
    --out "$QUEUE_OUT" --tag "$1" > "$QUEUE_OUT/tta-$1.log" 2>&1
}
lane() {  # GPU, then the rows of the lane
  local gpu=$1 cores=$(( $(nproc) / gpus ))
  shift
  taskset -cp "$((gpu * cores))-$((gpu * cores + cores - 1))" $BASHPID > /dev/null
  export CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_COMPILE_THREADS=$cores
  export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor-$gpu TRITON_CACHE_DIR=/tmp/queue/triton-$gpu
  for row in "$@"; do
    if [[ $row == gate_tests ]]; then gate_tests; else tta "$row"; fi
    echo "lane $gpu: $row ended with $? at $(date -u +%T)"
    # The next row starts from empty caches too, as a user's first job on that model does.
    rm -rf "/tmp/queue/inductor-$gpu" "/tmp/queue/triton-$gpu"
  done
}
if ((gpus >= 2)); then
  lane 0 qwen2 &
  lanes=($!)
  lane 1 gate_tests qwen15 &
  lanes+=($!)
  for pid in "${lanes[@]}"; do wait "$pid"; done
else
  lane 0 gate_tests qwen2 qwen15
fi
