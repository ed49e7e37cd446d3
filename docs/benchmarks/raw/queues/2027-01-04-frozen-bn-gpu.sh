# The frozen-BatchNorm Trainer GPU test again after its fix: at 1a03cc5 on an H100 both its
# loops gave NaN from step 2 (the test's Adam had eps=0); the other 11 Trainer GPU tests and the
# gate's 26 passed. tools/device_queue.sh; carry [".whl", ".whl-tt"]; about 1 minute.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_fit_gpu.py -rA \
  --junitxml="$QUEUE_OUT/fit_gpu.xml" > "$QUEUE_OUT/fit_gpu.log" 2>&1
echo "tests/trainers/test_fit_gpu.py ended with $? at $(date -u +%T)"
