# One session's 30 minutes of one lent GPU (tools/device_queue.sh; carry [".whl", ".whl-tt"] on
# the first call): the levers on the scale feed at `llama-1b` and torchtitan again (issue 54,
# about 14 minutes), then the time to an answer on the Qwen2-style held-out decoder (issue 55,
# about 15 minutes), its GPU tests cut to the profiles' warm-up (the levers' ran first).
set -x
bash docs/benchmarks/raw/queues/2026-11-30-levers-2.sh
echo "levers-2 ended with $? at $(date -u +%T)"
TTA_ROWS=qwen2 TTA_GPU_TESTS=tests/tuner/search/test_warm_profiles.py \
  bash docs/benchmarks/raw/queues/2026-11-30-tta-5.sh
echo "tta qwen2 ended with $? at $(date -u +%T)"
