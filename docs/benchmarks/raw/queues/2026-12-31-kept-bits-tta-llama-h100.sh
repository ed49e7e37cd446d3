# Why the kept check's runs differ (benchmarks/kept_bits.py: the twin against itself and against
# the captured graph, with the process's own kernels, PyTorch's SDPA choice and the math backend
# alone), then issue 55's llama-1b row on an H100 (cold, then repeat from the cold job's files;
# on an H200 at b83ca26: 541 s and 155 s). tools/device_queue.sh; carry [".whl", ".whl-tt"] on
# the first call; STREAMTUNE_COMMIT the literal commit. About 4 minutes, then about 13.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
{ lscpu; cat /proc/loadavg; free -g; } > "$QUEUE_OUT/host.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
bits() { python benchmarks/kept_bits.py "$@" --out "$QUEUE_OUT" >> "$QUEUE_OUT/kept_bits.log" 2>&1; echo "kept_bits $* ended with $? at $(date -u +%T)"; }
for sdpa in default math; do
  bits transformer --preset small --precision fp32 --sdpa $sdpa
  bits hf:causal-lm --preset llama-1b --precision bf16-autocast --model-arg layers=2 --sdpa $sdpa
done
echo "before llama-1b: $(cat /proc/loadavg)" >> "$QUEUE_OUT/host.txt"
python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 --commit "$commit" \
  --out "$QUEUE_OUT" --tag llama-1b > "$QUEUE_OUT/tta-llama-1b.log" 2>&1
echo "llama-1b ended with $? at $(date -u +%T)"
