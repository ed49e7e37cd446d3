# Issue 52, the fifth node run. `nvidia-h100-x4` is not lent this session; the largest kind of
# several GPUs that is, `nvidia-h200-x2` (2 H200s of one host), runs it (tools/device_queue.sh).
# The `llama-1b` row of `--gpus N` (N = every GPU the machine has) against one GPU (bf16 with
# float8 allowed, the default job) after the finalizer's waits were cut (84f43aa and after): one
# gate memo for all of a job's workers (each had its own, CUDA_VISIBLE_DEVICES in its key, so the
# finalizer profiled again for 139 s), the final round measured while another worker gates the
# leader, the helpers' profiles taken earlier, and each worker's search opened while the claimer
# opens the job. The fourth run (2026-11-28-node-4.sh, d1073e1, 4 H100s): 614 s on 4 GPUs against
# 772 s on one (0.80x). Then the attention lever's microbenchmark (issue 54) and the GPU tests of
# that code, each only where it fits before the deadline. `node.py --rounds 1`: one interleaved
# round of the two picks (four windows each) gives the speed ratio's CI in about 120 s.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
commit=${STREAMTUNE_COMMIT:?the commit measured}
started=$(date +%s)
deadline=${DEADLINE_S:-1650}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
nvidia-smi topo -m > "$QUEUE_OUT/nvidia-smi-topo.txt" 2>&1
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.cuda.device_count(), torch.cuda.nccl.version(), torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1

task_node_llama() {
  python benchmarks/node.py --presets hf:causal-lm:llama-1b --precisions bf16-autocast,float8 \
    --gpus "$gpus" --rounds 1 --commit "$commit" --out "$QUEUE_OUT" --tag llama-1b
}

task_attention() {
  # Issue 54: the attention lever at each model's shapes, a microbenchmark of seconds per model.
  python benchmarks/attention.py --commit "$commit" --out "$QUEUE_OUT" \
    --presets hf:causal-lm:llama-1b,hf:causal-lm:llama-1b-large,transformer:medium
}

task_gpu_tests() {
  python -m pytest -q -m gpu -p no:cacheprovider \
    "tests/trainers/test_lever_module.py" "tests/trainers/test_attention_lever.py" \
    "tests/tuner/test_cli_gpus.py::test_on_real_gpus_a_worker_with_no_trial_left_gates_while_the_others_run" \
    --junitxml="$QUEUE_OUT/gpu-tests.xml"
}

for entry in node_llama:1250 attention:120 gpu_tests:250; do
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
