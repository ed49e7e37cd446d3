# Issue 55's two rows left after 2026-12-02 on nvidia-h200 (tools/device_queue.sh; carry
# [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit). At d8153cc the
# Qwen1.5-0.5B row was inside both aims on one H200 to itself (cold 529 s and 535 s, repeat
# 160 s). Each row here: benchmarks/time_to_answer.py, a default job (float8 allowed) from empty
# Inductor and Triton caches and empty storage, then a repeat job in a new process with empty
# caches given only the first job's SQLite file and artefacts file, then one interleaved round
# of the two picks.
# First (about 12 minutes; QUEUE_LLAMA=0 leaves it out) `llama-1b`, last measured at c8b23c3
# (536 s cold, 146 s repeat), before the held corner, the probes, the second stage's float8
# levers and the fresh-model fix; at b83ca26 on 2026-12-03, 541 s and 155 s.
# Then (about 14 minutes; QUEUE_QWEN2=0 leaves it out) the Qwen2-style decoder (0.49B,
# vocabulary 151,936; 671 s cold beside another lane's compiles at its last run, 129 s repeat).
# A device call comes back about 70 s after its command ends: make the next `wait` at once (on
# 2026-12-02 a second call 70 s after the first found the machine gone).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
if [[ ${QUEUE_LLAMA:-1} == 1 ]]; then
  python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
    --precisions bf16-autocast,float8 --rounds 1 --commit "$commit" --out "$QUEUE_OUT" \
    --tag llama-1b > "$QUEUE_OUT/tta-llama-1b.log" 2>&1
  echo "llama-1b ended with $? at $(date -u +%T)"
fi
[[ ${QUEUE_QWEN2:-1} == 1 ]] || exit 0
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
mapfile -t passed < <(as_job "${qwen2[@]}")
python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
  --out "$QUEUE_OUT" --tag qwen2 > "$QUEUE_OUT/tta-qwen2.log" 2>&1
echo "qwen2 ended with $? at $(date -u +%T)"
