# The gate's planted-fault and replay GPU tests at the commit that keys FX graphs the same in
# every process (trainers/cache_key.py), as issue 55 asks of any change to the compile reuse
# (tools/device_queue.sh; carry [".whl", ".whl-tt"]; STREAMTUNE_COMMIT the literal commit).
# About 4 minutes of one H200.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py \
  tests/tuner/search/test_isolated.py -rA --junitxml="$QUEUE_OUT/gate-gpu.xml" \
  > "$QUEUE_OUT/gate-gpu.log" 2>&1
echo "gate tests ended with $? at $(date -u +%T)"
