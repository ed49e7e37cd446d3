# The float8 GPU tests with the new one: the compiled float8 step inside a whole-step CUDA graph
# (each scope) trains as without it (tools/device_queue.sh; carry [".whl", ".whl-tt"];
# STREAMTUNE_COMMIT the literal commit). About 3 minutes of one H200.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_gpu.py -rA \
  -k "not llama and not gpt2" --junitxml="$QUEUE_OUT/float8_gpu.xml" > "$QUEUE_OUT/float8_gpu.log" 2>&1
echo "float8 tests ended with $? at $(date -u +%T)"
