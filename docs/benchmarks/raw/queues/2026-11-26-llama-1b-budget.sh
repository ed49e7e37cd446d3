# Issue 32 on one H100 (tools/device_queue.sh), commit 130e597 (the scale space's default budget): the default job on the 1.1B
# preset that fits (8 x 2048 tokens) from a cold cache, as a user types it; then the scale peers
# measured interleaved against that job's recommendation (no second tuning job); then the
# default job on the preset whose plain step does not fit (16 x 2048 tokens). The queue before
# (2026-11-26-llama-1b.sh, commit 396a502) ran its first job 29 minutes without an end: the scale
# space had no search budget then.
set -x
commit=130e597
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python benchmarks/default_job.py --workload hf:causal-lm --preset llama-1b \
  --precision bf16-autocast --runs cold --tag llama-1b --commit $commit --out "$QUEUE_OUT" \
  --scratch /tmp/queue/dj-l1b
cache=$(find /tmp/queue/dj-l1b -type d -name inductor-cache | head -1)
TORCHINDUCTOR_CACHE_DIR=${cache:-/tmp/inductor} python benchmarks/peers.py \
  --presets hf:causal-lm:llama-1b --precisions bf16-autocast --protocol 3,5,6 --rounds 2 \
  --recommendation "$(ls "$QUEUE_OUT"/default-job-*-llama-1b.json)" --tag llama-1b-bf16 \
  --commit $commit --out "$QUEUE_OUT"
python benchmarks/default_job.py --workload hf:causal-lm --preset llama-1b-large \
  --precision bf16-autocast --runs cold --tag llama-1b-large --commit $commit \
  --out "$QUEUE_OUT" --scratch /tmp/queue/dj-l1b-large
