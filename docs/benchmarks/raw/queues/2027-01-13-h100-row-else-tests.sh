# One machine start, whichever card comes: on an H100, issue 54's row (2027-01-11-beyond-h100.sh,
# BEYOND_ROWS picks it); on any other card, the GPU test files not yet run at this code
# (tuner/test_readme after its PYTHONPATH fix, then test_levers_gpu.py whole and the library
# models). tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT
# the literal commit.
set -x
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $card == *H100* ]]; then
  source docs/benchmarks/raw/queues/2027-01-11-beyond-h100.sh
  exit
fi
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
