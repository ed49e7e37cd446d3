# Issue 52, the second node run, on one host of four H100s (tools/device_queue.sh), after what the
# first showed (docs/benchmarks/node-h100-2026-11-27-medium.md, data-parallel-h100-2026-11-27-
# medium.md): the workers of a `--gpus N` job now share one GPU's default search budget over N
# and count the patience over the job's trials, and a data-parallel search starts from the
# torchrun peers' own loops. Each task takes the whole node, so tasks run one after another.
#
# In order, each started only when its expected length fits the time left (DEADLINE_S):
# 1. node_medium: transformer:medium, `--gpus 4` then one GPU (the first run's wall ratio was
#    0.94 with the 4-GPU job running all 40 trials; this shows the fix);
# 2. dp_medium: the data-parallel job on transformer:medium against the torchrun peers (the
#    first run recommended 0.84x the DDP + compile + fused peer);
# 3. node_llama: llama-1b, bf16 with float8 allowed, `--gpus 4` then one GPU (about 1,250 s:
#    the one-GPU job alone took 890 s at dac6cd4); the 0.40x row.
# dp_llama (`--presets hf:causal-lm:llama-1b --precision bf16-autocast --nproc 4`) needs a
# session of its own.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
commit=${STREAMTUNE_COMMIT:?the commit measured}
started=$(date +%s)
deadline=${DEADLINE_S:-1500}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())' > "$QUEUE_OUT/versions.txt" 2>&1

task_node_medium() {
  python benchmarks/node.py --presets transformer:medium --gpus 4 --commit "$commit" \
    --out "$QUEUE_OUT" --tag medium
}
task_dp_medium() {
  python benchmarks/data_parallel.py --presets transformer:medium --nproc 4 --peers torchrun \
    --rounds 2 --commit "$commit" --out "$QUEUE_OUT" --tag medium
}
task_node_llama() {
  python benchmarks/node.py --presets hf:causal-lm:llama-1b --precisions bf16-autocast,float8 \
    --gpus 4 --commit "$commit" --out "$QUEUE_OUT" --tag llama-1b
}

for entry in node_medium:420 dp_medium:720 node_llama:1300; do
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
