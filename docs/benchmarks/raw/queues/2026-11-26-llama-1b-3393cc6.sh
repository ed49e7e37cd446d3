# Issue 32 on one H100 (tools/device_queue.sh), commit 3393cc6: the default job on the 1.1B preset
# that fits (8 x 2048 tokens) from a cold cache, as a user types it, now with the final round
# gating only configs that can tie (c38c074) and the scale space's 10-step windows (3393cc6);
# then the scale peers measured interleaved against that job's recommendation (no second tuning
# job). The preset whose plain step does not fit runs on a second machine
# (2026-11-26-llama-1b-large-306d389.sh): both do not fit in one machine's 30 minutes.
set -x
commit=3393cc6
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python benchmarks/default_job.py --workload hf:causal-lm --preset llama-1b \
  --precision bf16-autocast --runs cold --tag llama-1b-$commit --commit $commit \
  --out "$QUEUE_OUT" --scratch /tmp/queue/dj-l1b
cache=$(find /tmp/queue/dj-l1b -type d -name inductor-cache | head -1)
TORCHINDUCTOR_CACHE_DIR=${cache:-/tmp/inductor} python benchmarks/peers.py \
  --presets hf:causal-lm:llama-1b --precisions bf16-autocast --protocol 3,5,6 --rounds 2 \
  --recommendation "$(ls "$QUEUE_OUT"/default-job-*-llama-1b-$commit.json)" --tag llama-1b-bf16 \
  --commit $commit --out "$QUEUE_OUT"
