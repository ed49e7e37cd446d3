# The two `compile-graph` Trainer GPU tests under Inductor's default cache folder, repeated: on
# 2026-12-06 (6a9e187, one H100) they passed with a fresh TORCHINDUCTOR_CACHE_DIR and failed in
# the 7th digit with the default folder that an earlier run of the file had filled. Here the
# whole file fills the default folder once (run a), then the two tests run three times on it
# (runs b-d). One device call, under 4 minutes: `bash <this file>` with OUT set.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
nvidia-smi --query-gpu=index,name,driver_version --format=csv > "$OUT/nvidia-smi.csv"
python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())' > "$OUT/versions.txt" 2>&1
echo "commit $commit" >> "$OUT/versions.txt"
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_fit_gpu.py -rA \
  --junitxml="$OUT/a.xml" > "$OUT/a.log" 2>&1
echo "run a (whole file) ended with $? at $(date -u +%T)"
for run in b c d; do
  python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_fit_gpu.py -rA \
    -k compile-graph --junitxml="$OUT/$run.xml" > "$OUT/$run.log" 2>&1
  echo "run $run (compile-graph) ended with $? at $(date -u +%T)"
done
ls -la /tmp/torchinductor_* 2>/dev/null | head -3
