# The queue of 2026-12-18 with the float8 linears lever's GPU tests (the probe timing groups,
# 9d1559f, never run on a GPU) between issue 55's Qwen2-style row and the gate's planted-fault GPU
# tests, so a budget that runs out cuts the gate tests first. tools/device_queue.sh; carry
# [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit. About 20 minutes of
# one H200. A device call comes back about 70 s after its command ends: make the next `wait` at once.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
mapfile -t passed < <(as_job "${qwen2[@]}")
python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
  --out "$QUEUE_OUT" --tag qwen2 > "$QUEUE_OUT/tta-qwen2.log" 2>&1
echo "qwen2 ended with $? at $(date -u +%T)"
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_linears_lever.py -rA \
  --junitxml="$QUEUE_OUT/float8_linears_gpu.xml" > "$QUEUE_OUT/float8_linears_gpu.log" 2>&1
echo "float8 linears tests ended with $? at $(date -u +%T)"
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py \
  tests/tuner/search/test_isolated.py -rA --junitxml="$QUEUE_OUT/gate_gpu.xml" \
  > "$QUEUE_OUT/gate_gpu.log" 2>&1
echo "gate tests ended with $? at $(date -u +%T)"
