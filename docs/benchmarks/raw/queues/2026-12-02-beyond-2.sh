# Issue 54's rows 3 and 4, on nvidia-h200-x2 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on
# the first call; STREAMTUNE_COMMIT the literal commit), one lane per GPU, each on half the host's
# cores (taskset; Inductor's compile workers as many) with Inductor and Triton caches of its own,
# empty (a user's first run). Each row is a default job (the CLI's 40 trials, no search timeout,
# the default profiles) that may choose float8, against the five scale peers, 2 rounds
# interleaved, with the ablation (`peers-*-beyond-*.json`, key `ablation`), as in
# 2026-12-01-beyond-1.sh (which measured `llama-1b` and the Llama-3.2-1B shape).
# GPU 0: the second held-out decoder, the GPT-2-large shape (0.77B, vocabulary 50,257: not a
# multiple of 16, so the float8 head is refused there). GPT-2's projections are Hugging Face
# Conv1D modules, which torchao's recipe (the float8 peers) does not convert and streamtune's
# float8 does since 2026-11-30 (`Float8Conv1D`); first, that GPU test. GPU 1: the third, the
# Pythia-1B shape (1.01B, vocabulary 50,304). Both named in the note of 2026-11-30
# before their first run.
# Both set kv_heads=0 (no grouped-query attention: the preset's 8 is refused for these arches).
# On one GPU (nvidia-h200, when no x2 is lent) the lane runs the GPU test and the GPT-2 row.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --allow-precisions float8
  --trials 40 --profile baselines --peers $peers --rounds 2 --peer-protocol 4,8,4
  --commit "$commit" --out "$QUEUE_OUT" --model-arg seq=2048 --model-arg batch=8)
gpt2large=(--model-arg arch=gpt2 --model-arg hidden=1280 --model-arg layers=36 --model-arg heads=20
  --model-arg kv_heads=0 --model-arg ffn=5120 --model-arg vocab=50257)
pythia1b=(--model-arg arch=gpt_neox --model-arg hidden=2048 --model-arg layers=16 --model-arg heads=8
  --model-arg kv_heads=0 --model-arg ffn=8192 --model-arg vocab=50304)
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
gpt2row='python benchmarks/peers.py "${row[@]}" "${gpt2large[@]}" --tag beyond-gpt2-large > "$QUEUE_OUT/beyond-gpt2-large.log" 2>&1'
pythiarow='python benchmarks/peers.py "${row[@]}" "${pythia1b[@]}" --tag beyond-pythia-1b > "$QUEUE_OUT/beyond-pythia-1b.log" 2>&1'
tests='python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_gpu.py -k gpt2 -rA --junitxml="$QUEUE_OUT/gpu-tests.xml" > "$QUEUE_OUT/gpu-tests.log" 2>&1'
if ((gpus >= 2)); then
  lane 0 "$tests" "$gpt2row" &
  lanes=($!)
  lane 1 "$pythiarow" &
  lanes+=($!)
  for pid in "${lanes[@]}"; do wait "$pid"; done
else
  lane 0 "$tests" "$gpt2row"
fi
