# The GPU test files that did not run at b9582c2 (2027-01-10-gpu-suite-h100.sh was cut inside
# test_levers_gpu.py when the device time ran out), the short ones first, then
# test_levers_gpu.py (more than 10 minutes alone) and the library models (this session's
# changes are in the hf:causal-lm build). One file per pytest process. tools/device_queue.sh;
# carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit. The files
# that need two GPUs skip on one.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
export TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
for file in trainers/test_scale_gpu trainers/test_float8_gpu \
  trainers/test_float8_head_lever trainers/test_float8_linears_lever trainers/test_loss_lever \
  trainers/test_attention_lever trainers/test_kernels_lever trainers/test_lever_module \
  tuner/search/test_warm_profiles tuner/evidence/test_profiles tuner/test_cli_gpus \
  tuner/test_readme tuner/service/test_leases trainers/test_ddp_gpu \
  trainers/test_levers_gpu trainers/test_model_workloads; do
  name=${file//\//-}
  python -m pytest -q -m gpu -p no:cacheprovider "tests/$file.py" -rA \
    --junitxml="$QUEUE_OUT/$name.xml" > "$QUEUE_OUT/$name.log" 2>&1
  echo "tests/$file.py ended with $? at $(date -u +%T)"
done
