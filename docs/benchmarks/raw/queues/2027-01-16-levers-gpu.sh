# What is left of the GPU test files at this code, on whichever card comes: test_levers_gpu.py
# whole (more than 10 minutes; cut at 17-36 passed, none failed, in four earlier sessions), one
# test per line in its log as it ends (-v, unbuffered: at 0589840 `-q -v` printed dots, and
# only those flushed came back), so a cut run still says which passed. tools/device_queue.sh;
# carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
export TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
PYTHONUNBUFFERED=1 python -m pytest -m gpu -p no:cacheprovider tests/trainers/test_levers_gpu.py -rA -v \
  --junitxml="$QUEUE_OUT/trainers-test_levers_gpu.xml" > "$QUEUE_OUT/trainers-test_levers_gpu.log" 2>&1
echo "tests/trainers/test_levers_gpu.py ended with $? at $(date -u +%T)"
