# Issue 55's rows on an H100 after the kept check's noise test (trainers.gate.within_twin_noise,
# 8df95f0): the gate of a whole-step graph whose process kernels do not reproduce should no
# longer run its twin in the strict child (98 s of llama-1b's 596 s cold job at c1bf87b).
# TTA_ROWS: the rows, in order (default "llama-1b qwen2"; qwen15 too). tools/device_queue.sh;
# carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit. About 13
# minutes for llama-1b, 15 for the Qwen2-style decoder, 13 for the Qwen1.5 shape.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
{ lscpu; cat /proc/loadavg; free -g; } > "$QUEUE_OUT/host.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
tta() {  # tag, then the model's arguments (none: the preset itself)
  local tag=$1; shift
  echo "before $tag: $(cat /proc/loadavg)" >> "$QUEUE_OUT/host.txt"
  mapfile -t passed < <(as_job "$@")
  python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
    --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
    --out "$QUEUE_OUT" --tag "$tag" > "$QUEUE_OUT/tta-$tag.log" 2>&1
  echo "$tag ended with $? at $(date -u +%T)"
}
for row in ${TTA_ROWS:-llama-1b qwen2}; do
  case $row in
    llama-1b) tta llama-1b ;;
    qwen2) tta qwen2 --model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 \
      --model-arg heads=14 --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 \
      --model-arg tie=true --model-arg seq=2048 --model-arg batch=8 ;;
    qwen15) tta qwen15 --model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 \
      --model-arg heads=16 --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 \
      --model-arg tie=true --model-arg seq=2048 --model-arg batch=8 ;;
    *) echo "unknown row $row (allowed: llama-1b, qwen2, qwen15)"; exit 2 ;;
  esac
done
