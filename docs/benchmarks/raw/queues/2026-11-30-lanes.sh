# Issues 54 and 55 on nvidia-h200-x2 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the
# first call), one lane per GPU: GPU 0 the float8 head (2026-11-30-float8-head.sh), GPU 1 the
# time to an answer on the Mistral-style held-out decoder (2026-11-30-tta-5.sh, no tests), whose
# default job is also the first GPU run of the scale space searching the compiled loss. The
# lanes share the host's CPUs (Inductor's compile workers): the time-to-answer record is an
# upper bound of a machine to itself (`lanes.txt`).
set -x
echo "lanes: float8 head on 0, mistral time to an answer on 1, both from $(date -u +%T)" > "$QUEUE_OUT/lanes.txt"
QUEUE_GPU=0 bash docs/benchmarks/raw/queues/2026-11-30-float8-head.sh > "$QUEUE_OUT/lane-0.log" 2>&1 &
lanes=($!)
QUEUE_GPU=1 TTA_ROWS=mistral TTA_GPU_TESTS=none \
  bash docs/benchmarks/raw/queues/2026-11-30-tta-5.sh > "$QUEUE_OUT/lane-1.log" 2>&1 &
lanes+=($!)
for lane in "${lanes[@]}"; do
  wait "$lane"
  echo "lane $lane ended with $? at $(date -u +%T)"
done
