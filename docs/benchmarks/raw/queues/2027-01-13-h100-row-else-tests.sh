# One machine start, whichever card comes: on an H100, issue 54's row (2027-01-11-beyond-h100.sh,
# BEYOND_ROWS picks it); on any other card, the GPU test files not yet run at this code
# (2027-01-14-gpu-tests-rest.sh). tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT
# the literal commit.
set -x
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $card == *H100* ]]; then
  source docs/benchmarks/raw/queues/2027-01-11-beyond-h100.sh
  exit
fi
source docs/benchmarks/raw/queues/2027-01-14-gpu-tests-rest.sh
