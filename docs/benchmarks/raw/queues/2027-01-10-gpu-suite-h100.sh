# Every GPU test but the gate's (those ran at the same commit just before, in
# 2027-01-09-qwen15-peers-then-gate-h100.sh), one file per pytest process, the files the
# seventieth session's changes touch first (the Trainer, the feed's micro-batches, sparse
# optimizers, the library models). At b9582c2 the first three files took 3.5 minutes and
# test_levers_gpu.py more than 10. tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first
# call; STREAMTUNE_COMMIT the literal commit. The files that need two GPUs skip on one.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
export TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
for file in trainers/test_fit_gpu trainers/test_gpu trainers/test_model_workloads \
  trainers/test_levers_gpu trainers/test_scale_gpu trainers/test_float8_gpu \
  trainers/test_float8_head_lever trainers/test_float8_linears_lever trainers/test_loss_lever \
  trainers/test_attention_lever trainers/test_kernels_lever trainers/test_lever_module \
  tuner/search/test_warm_profiles tuner/evidence/test_profiles tuner/test_cli_gpus \
  tuner/test_readme tuner/service/test_leases trainers/test_ddp_gpu; do
  name=${file//\//-}
  python -m pytest -q -m gpu -p no:cacheprovider "tests/$file.py" -rA \
    --junitxml="$QUEUE_OUT/$name.xml" > "$QUEUE_OUT/$name.log" 2>&1
  echo "tests/$file.py ended with $? at $(date -u +%T)"
done
