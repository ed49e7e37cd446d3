# The kept check's GPU tests and the gate's planted-fault and replay tests on an H100 (the
# 2026-12-29 queue's middle part: a session's last 837 s of device time could not hold a row).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
# The host's CPUs and load: compiles are CPU-bound, and at aaed237 every compile took 1.5x its
# time at e3c3c83 on an H200 host whose CPU was not recorded.
{ lscpu; cat /proc/loadavg; free -g; } > "$QUEUE_OUT/host.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
# One -k: pytest keeps the last of several.
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/kept.xml" \
  tests/trainers/test_gate_gpu.py tests/tuner/search/test_isolated.py \
  -k "process_kernels or eager_twins_bits" > "$QUEUE_OUT/kept.log" 2>&1
echo "kept tests ended with $? at $(date -u +%T)"
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/gate_gpu.xml" \
  tests/trainers/test_gate_gpu.py -k "not process_kernels" > "$QUEUE_OUT/gate_gpu.log" 2>&1
echo "gate tests ended with $? at $(date -u +%T)"
