# The GPU test files not yet run at this code, on whichever card comes: tuner/test_readme after
# its PYTHONPATH fix (f0b354b), the library models (the hf:causal-lm build changed since they
# last ran), then test_levers_gpu.py whole (more than 10 minutes; cut at 20 passed before).
# One file per pytest process. tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first
# call; STREAMTUNE_COMMIT the literal commit.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
export TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
for file in tuner/test_readme trainers/test_model_workloads trainers/test_levers_gpu; do
  name=${file//\//-}
  python -m pytest -q -m gpu -p no:cacheprovider "tests/$file.py" -rA \
    --junitxml="$QUEUE_OUT/$name.xml" > "$QUEUE_OUT/$name.log" 2>&1
  echo "tests/$file.py ended with $? at $(date -u +%T)"
done
