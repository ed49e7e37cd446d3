# The Trainer's GPU tests after the sixty-fifth session's changes proven on the CPU only: a NaN
# loss said as its config's harvest brings it home (a captured, a compiled-and-captured and a
# four-stream query step), a namedtuple batch handed back to the loss. tools/device_queue.sh;
# carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit. About 3
# minutes on an H200.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_fit_gpu.py -rA \
  --junitxml="$QUEUE_OUT/fit_gpu.xml" > "$QUEUE_OUT/fit_gpu.log" 2>&1
echo "tests/trainers/test_fit_gpu.py ended with $? at $(date -u +%T)"
python -m pytest -q -p no:cacheprovider tests/trainers/test_own_batches.py tests/trainers/test_fit.py -k "nan or namedtuple" -rA \
  --junitxml="$QUEUE_OUT/own_batches.xml" > "$QUEUE_OUT/own_batches.log" 2>&1
echo "the CPU tests of NaN and namedtuples ended with $? at $(date -u +%T)"
