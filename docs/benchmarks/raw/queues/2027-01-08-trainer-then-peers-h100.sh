# On one H100: the Trainer's GPU tests (2027-01-07-trainer-gpu.sh, about 3 minutes), then the
# scale peers of PEER_ROWS (default "qwen15") against each row's H100 pick
# (2027-01-07-peers-config-h100.sh, about 6 minutes a row): one machine start for both, where
# starts were scarce (2026-12-07: most of the session's device time went to starts refused).
# tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the
# literal commit.
source docs/benchmarks/raw/queues/2027-01-07-trainer-gpu.sh
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR  # the peers compile as their own queue does
source docs/benchmarks/raw/queues/2027-01-07-peers-config-h100.sh
