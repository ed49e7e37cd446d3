# Issue 52, the fourth node run, on one host of four H100s (tools/device_queue.sh): the `llama-1b`
# row of `--gpus 4` against one GPU (bf16 with float8 allowed, the default job), after the
# workers of a `--gpus N` job began to share the gate (`tuner/service/gatehelp.py`): a worker with
# no trial left measures the study's envelope and gates the contenders while the others run their
# trials or decide, and a check whose envelope another worker measures runs its twin first; they
# also gate the trials still running and take the profiles ahead of the decision
# (`tuner/search/helping.py`). The third run (2026-11-28-node-3.sh, 9a0f537) lost its machine
# before the one-GPU job and ran none of the helping above but the envelope and complete trials.
# The one-GPU job alone took 890 s at dac6cd4 (compile 223, gate 335, measurement 68, final
# round 72, profiles 155, idle 38). node.py runs the 4-GPU job first, then the one-GPU job.
# transformer:medium and the data-parallel rows (2026-11-27-node-2.sh) wait for another session:
# this one's 1,800 device seconds hold the llama-1b pair alone.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
commit=${STREAMTUNE_COMMIT:?the commit measured}
started=$(date +%s)
deadline=${DEADLINE_S:-1600}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())' > "$QUEUE_OUT/versions.txt" 2>&1

task_node_llama() {
  python benchmarks/node.py --presets hf:causal-lm:llama-1b --precisions bf16-autocast,float8 \
    --gpus 4 --commit "$commit" --out "$QUEUE_OUT" --tag llama-1b
}

for entry in node_llama:1300; do
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
