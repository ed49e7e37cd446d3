# Issue 55 on one lent GPU (with tools/device_queue.sh): the time to an answer at `llama-1b`
# (bf16, float8 allowed, the default job), cold, then as a repeat job given only the cold job's
# SQLite file and artefacts file, then one interleaved round of the two picks. Since 5b60579
# (cold 736 s, repeat 129 s on one H200): the gate's config run keeps its twin's compiled code,
# the gate's child builds beside the trials, and the profiles' child runs the leader beside its
# gate (the recommended config's profile compiled 75 s in its child before). Then the GPU tests
# of the gate's planted faults and of the code kept between runs, then the Qwen2-style
# held-out decoder's pair while time is left.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 --commit "$commit" --out "$QUEUE_OUT" --tag llama-1b \
  > "$QUEUE_OUT/tta.log" 2>&1
echo "time_to_answer ended with $? at $(date -u +%T)"
CUDA_VISIBLE_DEVICES=0 python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py \
  tests/trainers/test_float8_gpu.py tests/tuner/search/test_warm_profiles.py \
  tests/tuner/search/test_isolated.py -rA --junitxml="$QUEUE_OUT/gpu-tests.xml" \
  > "$QUEUE_OUT/gpu-tests.log" 2>&1
echo "gpu tests ended with $? at $(date -u +%T)"
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
mapfile -t passed < <(as_job "${qwen2[@]}")
CUDA_VISIBLE_DEVICES=0 python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
  --out "$QUEUE_OUT" --tag qwen2 > "$QUEUE_OUT/tta-qwen2.log" 2>&1
echo "time_to_answer qwen2 ended with $? at $(date -u +%T)"
