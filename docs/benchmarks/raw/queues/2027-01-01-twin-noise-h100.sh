# The kept check held within its twin's run-to-run noise (trainers.gate.within_twin_noise): the
# process-kernels GPU test on three workloads (transformer small fp32, hf tiny bf16, two layers
# of the Llama-1B shape at 2048 tokens), each planted fault's ratio to the twin's own noise in
# the JUnit properties; then the tuner's kept test. tools/device_queue.sh; carry [".whl"] on the
# first call; STREAMTUNE_COMMIT the literal commit. About 6 minutes.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
# One -k: pytest keeps the last of several.
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/noise.xml" \
  tests/trainers/test_gate_gpu.py -k "process_kernels" > "$QUEUE_OUT/noise.log" 2>&1
echo "noise tests ended with $? at $(date -u +%T)"
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/kept.xml" \
  tests/tuner/search/test_isolated.py -k "eager_twins_bits" > "$QUEUE_OUT/kept.log" 2>&1
echo "kept tests ended with $? at $(date -u +%T)"
