# Issue 55's last two H100 records on one start: the Qwen1.5-shaped row of
# 2027-01-07-peers-config-h100.sh with its two fastest peers (about 12 minutes), then, if the
# lease lasts, the gate's planted-fault and replay GPU tests at this commit (about 4 minutes; the
# kept check's twin-noise bound and the seed envelope changed the gate since their last whole
# run, f9f0c71 on an H200). tools/device_queue.sh; carry [".whl", ".whl-tt"]; STREAMTUNE_COMMIT
# the literal commit.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
PEER_SET=compile-fused,float8-compile PEER_ROWS=qwen15 \
  bash docs/benchmarks/raw/queues/2027-01-07-peers-config-h100.sh
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py \
  tests/tuner/search/test_isolated.py -rA --junitxml="$QUEUE_OUT/gate-gpu.xml" \
  > "$QUEUE_OUT/gate-gpu.log" 2>&1
echo "gate tests ended with $? at $(date -u +%T)"
