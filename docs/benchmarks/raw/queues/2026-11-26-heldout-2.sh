# Issue 47 on one host of four H100s (tools/device_queue.sh): the held-out rows and the presets'
# rows, four lanes side by side, each on a GPU of its own (CUDA_VISIBLE_DEVICES) with its own
# Inductor and Triton caches (cold, as a user's first run). Each row's loops are interleaved in
# its own process; no figure compares across lanes.
#
# The lanes take tasks from one list in order, each the next one not yet taken, and start a task
# only when its expected length fits the time left before the machine goes back (30 minutes
# held; DEADLINE_S after the queue starts). Each row is a default tuning job that may choose
# float8 (the CLI's 40 trials, no search timeout, profiles of the baselines as a default job
# takes them) against the five scale peers.
#
# The held-out models (chosen in the session before, none used while developing the search):
# the GPT-NeoX-style 0.4B (Pythia-410m's shape), the Mistral-style 1.07B (28 layers of 1536)
# and the Qwen2-style 0.5B (its first row, at 2578c2a, is kept beside this one).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
started=$(date +%s)
deadline=${DEADLINE_S:-1620}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.cuda.device_count())' > "$QUEUE_OUT/versions.txt" 2>&1

peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--precisions bf16-autocast --allow-precisions float8 --trials 40 --profile baselines
  --peers $peers --rounds 2 --commit "$commit" --out "$QUEUE_OUT")
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
neox=(--model-arg arch=gpt_neox --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg ffn=4096 --model-arg vocab=50304 --model-arg seq=2048 --model-arg batch=8)
mistral=(--model-arg arch=mistral --model-arg hidden=1536 --model-arg layers=28
  --model-arg heads=12 --model-arg kv_heads=4 --model-arg ffn=6144 --model-arg vocab=32000
  --model-arg seq=2048 --model-arg batch=8)

task_llama_1b_large() {
  python benchmarks/peers.py --presets hf:causal-lm:llama-1b-large "${row[@]}" \
    --peer-protocol 4,4,4 --tag heldout-llama-1b-large
}
task_llama_1b() {
  python benchmarks/peers.py --presets hf:causal-lm:llama-1b "${row[@]}" --peer-protocol 4,8,4 \
    --tag heldout-llama-1b
}
task_mistral() {
  python benchmarks/peers.py --presets hf:causal-lm:default "${mistral[@]}" "${row[@]}" \
    --peer-protocol 4,8,4 --tag heldout-mistral-1.07b
}
task_neox() {
  python benchmarks/peers.py --presets hf:causal-lm:default "${neox[@]}" "${row[@]}" \
    --peer-protocol 4,8,4 --tag heldout-neox-0.4b
}
task_qwen2() {
  python benchmarks/peers.py --presets hf:causal-lm:default "${qwen2[@]}" "${row[@]}" \
    --peer-protocol 4,8,4 --tag heldout-qwen2-0.5b
}
# What the portable compile artefacts save: the 126M development job (not held out) three times,
# each with a compile cache folder of its own: empty (cold); the first run's (warm, the same
# machine); empty but for the first run's artefacts file (a new machine with the file copied).
task_artifacts() {
  local dev=(--workload hf:causal-lm --preset llama-350m --model-arg layers=4 --model-arg batch=4
    --space scale --precisions bf16-autocast,float8 --device cuda --timeout 150 --final-rounds 1
    --profile none --json)
  local base=/tmp/queue/artifacts
  mkdir -p "$base/cold" "$base/copied"
  (
    unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
    TUNER_COMPILE_CACHE=$base/cold python -m tuner run "${dev[@]}" \
      --storage "sqlite:///$QUEUE_OUT/artifacts-cold.db" > "$QUEUE_OUT/artifacts-cold.json" \
      2> "$QUEUE_OUT/artifacts-cold.log"
    cp "$base/cold/streamtune-compile-artifacts.bin" "$base/copied/" || true
    ls -la "$base/cold" "$base/copied" > "$QUEUE_OUT/artifacts-folders.txt" 2>&1
    TUNER_COMPILE_CACHE=$base/cold python -m tuner run "${dev[@]}" \
      --storage "sqlite:///$QUEUE_OUT/artifacts-warm.db" > "$QUEUE_OUT/artifacts-warm.json" \
      2> "$QUEUE_OUT/artifacts-warm.log"
    TUNER_COMPILE_CACHE=$base/copied python -m tuner run "${dev[@]}" \
      --storage "sqlite:///$QUEUE_OUT/artifacts-copied.db" > "$QUEUE_OUT/artifacts-copied.json" \
      2> "$QUEUE_OUT/artifacts-copied.log"
  )
}
task_gpu_tests() {
  python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py \
    --junitxml "$QUEUE_OUT/gate-gpu-tests.xml"
}
task_gate_large() {
  python benchmarks/precision_gate.py --workload hf:causal-lm --preset llama-1b-large \
    --precision bf16-autocast --config-precision float8 \
    --config '{"compile": "default", "optimizer": "fused", "compile_scope": "blocks"}' \
    --parity-steps 20 --precision-parity-steps 200 --commit "$commit" --out "$QUEUE_OUT" \
    --tag llama-1b-large-stream
}

# name and expected seconds, in the order the lanes take them
tasks=(llama_1b_large:1550 llama_1b:1400 mistral:1400 neox:950 artifacts:620 gpu_tests:240
  qwen2:1150 gate_large:1300)

next_task() {
  # One lane at a time takes the next index (mkdir is atomic).
  until mkdir /tmp/queue/take.lock 2>/dev/null; do sleep 0.2; done
  local index
  index=$(cat /tmp/queue/next 2>/dev/null || echo 0)
  echo $((index + 1)) > /tmp/queue/next
  rmdir /tmp/queue/take.lock
  echo "$index"
}

lane() {
  local index entry name expected left
  while true; do
    index=$(next_task)
    ((index < ${#tasks[@]})) || return 0
    entry=${tasks[$index]} name=${entry%%:*} expected=${entry##*:}
    left=$((started + deadline - $(date +%s)))
    if ((expected > left)); then
      echo "lane $1: $name not started ($expected s expected, $left s left) $(date -u +%T)"
      continue
    fi
    echo "lane $1: $name started $(date -u +%T)"
    task_$name > "$QUEUE_OUT/$name.log" 2>&1
    echo "lane $1: $name ended with $? at $(date -u +%T)"
  done
}

for gpu in 0 1 2 3; do
  (
    export CUDA_VISIBLE_DEVICES=$gpu
    export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor-$gpu TRITON_CACHE_DIR=/tmp/queue/triton-$gpu
    lane $gpu
  ) > "$QUEUE_OUT/lane$gpu.log" 2>&1 &
done
wait
