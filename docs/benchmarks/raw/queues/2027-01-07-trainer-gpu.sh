# The Trainer's GPU tests after the sixty-sixth session's changes: no checkpoint written once a
# NaN loss is harvested, and a float64 batch said in one line naming data, under a captured, a
# compiled-and-captured and a four-stream query step; then every other test of the file, and
# the session's CPU tests of the Trainer on that machine. tools/device_queue.sh; carry [".whl",
# ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit. About 3 minutes.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_fit_gpu.py -rA \
  --junitxml="$QUEUE_OUT/fit_gpu.xml" > "$QUEUE_OUT/fit_gpu.log" 2>&1
echo "tests/trainers/test_fit_gpu.py ended with $? at $(date -u +%T)"
python -m pytest -q -p no:cacheprovider tests/trainers/test_fit.py tests/trainers/test_fit_resume_checks.py -k "nan or dtypes or resume or eval" -rA \
  --junitxml="$QUEUE_OUT/fit_cpu.xml" > "$QUEUE_OUT/fit_cpu.log" 2>&1
echo "the Trainer's CPU tests ended with $? at $(date -u +%T)"
