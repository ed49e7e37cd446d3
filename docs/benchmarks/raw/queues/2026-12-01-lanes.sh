# The same work as 2026-12-01-levers-then-tta.sh (issues 54 and 55), on a machine of two or more
# GPUs (nvidia-h200-x2, -x4), one lane per GPU at once rather than one after the other: about 15
# minutes of the session's 30 rather than 29 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on
# the first call). GPU 0: the levers at `llama-1b` with their GPU tests, the probes and
# torchtitan. GPU 1: the time to an answer on the Qwen2-style held-out decoder, with the
# profiles' warm-up test. GPU 2, where there is one: the Mistral-style decoder's, without tests.
# The lanes share the host's CPUs (Inductor's compile workers): the time-to-answer records say
# which lanes ran beside them (`lanes.txt`), and their wall times are an upper bound of a
# machine to themselves.
set -x
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
echo "$gpus GPUs; lanes: levers on 0, qwen2 on 1$( ((gpus > 2)) && echo ', mistral on 2')" > "$QUEUE_OUT/lanes.txt"
QUEUE_GPU=0 bash docs/benchmarks/raw/queues/2026-11-30-levers-2.sh > "$QUEUE_OUT/lane-0.log" 2>&1 &
lanes=($!)
QUEUE_GPU=1 TTA_ROWS=qwen2 TTA_GPU_TESTS=tests/tuner/search/test_warm_profiles.py \
  bash docs/benchmarks/raw/queues/2026-11-30-tta-5.sh > "$QUEUE_OUT/lane-1.log" 2>&1 &
lanes+=($!)
if ((gpus > 2)); then
  QUEUE_GPU=2 TTA_ROWS=mistral TTA_GPU_TESTS=none \
    bash docs/benchmarks/raw/queues/2026-11-30-tta-5.sh > "$QUEUE_OUT/lane-2.log" 2>&1 &
  lanes+=($!)
fi
for lane in "${lanes[@]}"; do
  wait "$lane"
  echo "lane $lane ended with $? at $(date -u +%T)"
done
