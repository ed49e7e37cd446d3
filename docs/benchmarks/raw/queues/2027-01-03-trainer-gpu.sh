# The Trainer's GPU tests after the fifty-eighth and fifty-ninth sessions' changes proven on the
# CPU only: warmup_cosine's held end under a captured optimizer's tensor rate, a loss callback's
# error deferred past its counted step under a graph, a frozen BatchNorm's mode kept in a graph;
# then the gate's planted faults. tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first
# call; STREAMTUNE_COMMIT the literal commit. About 5 minutes on an H200.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
for name in fit_gpu gate_gpu; do
  python -m pytest -q -m gpu -p no:cacheprovider "tests/trainers/test_$name.py" -rA \
    --junitxml="$QUEUE_OUT/$name.xml" > "$QUEUE_OUT/$name.log" 2>&1
  echo "tests/trainers/test_$name.py ended with $? at $(date -u +%T)"
done
