# Issue 52 on one host of four H100s (tools/device_queue.sh): the first run of `--gpus` and of
# data-parallel tuning on a real node. Each task takes the whole node (every GPU, every core), so
# the tasks run one after another, never side by side: a job's wall time is the figure measured.
#
# 1. node_medium: the default job on transformer:medium with `--gpus 4`, then on one GPU, each
#    from its own empty compile cache (`benchmarks/node.py`; the 4-GPU job first, so a failure on
#    the node shows before the long job), then both recommendations interleaved on GPU 0.
# 2. dp_medium: the data-parallel job (`--nproc-per-node 4`) on transformer:medium against the
#    torchrun peers (DDP defaults, DDP + compile + fused AdamW, FSDP2 with each block compiled),
#    interleaved over 2 rounds, each profiled for its exposed NCCL time.
# A task starts only when its expected length fits the time left (DEADLINE_S from the start).
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
commit=${STREAMTUNE_COMMIT:?the commit measured}
started=$(date +%s)
deadline=${DEADLINE_S:-1500}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
nvidia-smi topo -m > "$QUEUE_OUT/topo.txt" 2>&1
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())' > "$QUEUE_OUT/versions.txt" 2>&1

task_node_medium() {
  python benchmarks/node.py --presets transformer:medium --gpus 4 --commit "$commit" \
    --out "$QUEUE_OUT" --tag medium
}
task_dp_medium() {
  python benchmarks/data_parallel.py --presets transformer:medium --nproc 4 --peers torchrun \
    --rounds 2 --commit "$commit" --out "$QUEUE_OUT" --tag medium
}
task_ddp_gpu_tests() {
  python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_ddp_gpu.py \
    --junitxml "$QUEUE_OUT/ddp-gpu-tests.xml"
}

# name and expected seconds, in order
for entry in node_medium:700 dp_medium:600 ddp_gpu_tests:120; do
  name=${entry%%:*} expected=${entry##*:}
  left=$((started + deadline - $(date +%s)))
  if ((expected > left)); then
    echo "$name not started ($expected s expected, $left s left) $(date -u +%T)"
    continue
  fi
  echo "$name started $(date -u +%T)"
  task_$name > "$QUEUE_OUT/$name.log" 2>&1
  echo "$name ended with $? at $(date -u +%T)"
done
