# Issue 32 on one H100 (tools/device_queue.sh), commit 306d389 (3393cc6 and the attention FLOP fix): the default job on the 1.1B preset
# whose plain step does not fit in 80 GB (16 x 2048 tokens) from a cold cache, as a user types it;
# then the scale peers (those that fit, and the one that does not) measured interleaved against
# its recommendation. Its first try (130e597) ended with every trial failed on the tuner's own
# memory (docs/benchmarks/raw/default-job-h100-2026-11-26-llama-1b-130e597/).
set -x
commit=306d389
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python benchmarks/default_job.py --workload hf:causal-lm --preset llama-1b-large \
  --precision bf16-autocast --runs cold --tag llama-1b-large-$commit --commit $commit \
  --out "$QUEUE_OUT" --scratch /tmp/queue/dj-l1b-large
cache=$(find /tmp/queue/dj-l1b-large -type d -name inductor-cache | head -1)
TORCHINDUCTOR_CACHE_DIR=${cache:-/tmp/inductor} python benchmarks/peers.py \
  --presets hf:causal-lm:llama-1b-large --precisions bf16-autocast --protocol 3,5,6 --rounds 2 \
  --recommendation "$(ls "$QUEUE_OUT"/default-job-*-llama-1b-large-$commit.json)" \
  --tag llama-1b-large-bf16 --commit $commit --out "$QUEUE_OUT"
