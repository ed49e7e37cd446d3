# Issue 52, the sixth node run, the first on `nvidia-h200-x4` (4 H200s of one host; the H100 kind
# the issue names is not lent this session), run with tools/device_queue.sh. The `llama-1b` row of
# `--gpus 4` against one GPU (bf16 with float8 allowed, the default job) after the two faults the
# fifth run (2026-11-28-node-5-h200x2.sh, 9f19856: 600 s on 2 GPUs against 791 s on one) found
# were fixed: the patience now ends a job's trials (the final round is claimed under the slot
# lock), and a helper measures the envelope the leader's precision needs. `node.py --rounds 1`:
# one interleaved round of the two picks on GPU 0.
#
# GPUs 1-3 stay idle until the one-GPU job has ended (work beside it would slow it and flatter
# the ratio); then, beside the interleaved round on GPU 0: the attention lever's microbenchmark
# and the gate's and the lever modules' GPU tests on GPU 1, and the `--gpus all` helper test on
# GPUs 2-3.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
commit=${STREAMTUNE_COMMIT:?the commit measured}
started=$(date +%s)
deadline=${DEADLINE_S:-1650}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
nvidia-smi topo -m > "$QUEUE_OUT/nvidia-smi-topo.txt" 2>&1
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.cuda.device_count(), torch.cuda.nccl.version(), torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1

python benchmarks/node.py --presets hf:causal-lm:llama-1b --precisions bf16-autocast,float8 \
  --gpus "$gpus" --rounds 1 --commit "$commit" --out "$QUEUE_OUT" --tag llama-1b \
  > "$QUEUE_OUT/node_llama.log" 2>&1 &
node=$!
echo "node_llama started $(date -u +%T)"
while kill -0 "$node" 2> /dev/null && [[ ! -f $QUEUE_OUT/node-llama-1b-gpus1-recommendation.json ]]; do
  sleep 5
done
echo "one-GPU job over (or node.py ended) at $(date -u +%T): GPUs 1-3 start"

(
  export CUDA_VISIBLE_DEVICES=1
  python benchmarks/attention.py --commit "$commit" --out "$QUEUE_OUT" \
    --presets hf:causal-lm:llama-1b,hf:causal-lm:llama-1b-large,transformer:medium \
    > "$QUEUE_OUT/attention.log" 2>&1
  echo "attention ended with $? at $(date -u +%T)"
  python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py \
    tests/trainers/test_lever_module.py tests/trainers/test_attention_lever.py \
    --junitxml="$QUEUE_OUT/gpu-tests-1.xml" > "$QUEUE_OUT/gpu-tests-1.log" 2>&1
  echo "gpu tests on GPU 1 ended with $? at $(date -u +%T)"
) &
side1=$!
(
  export CUDA_VISIBLE_DEVICES=2,3
  python -m pytest -q -m gpu -p no:cacheprovider \
    "tests/tuner/test_cli_gpus.py::test_on_real_gpus_a_worker_with_no_trial_left_gates_while_the_others_run" \
    --junitxml="$QUEUE_OUT/gpu-tests-23.xml" > "$QUEUE_OUT/gpu-tests-23.log" 2>&1
  echo "gpu tests on GPUs 2-3 ended with $? at $(date -u +%T)"
) &
side23=$!

wait "$node"
echo "node_llama ended with $? at $(date -u +%T)"
while (( $(date +%s) < started + deadline )) && { kill -0 "$side1" 2> /dev/null || kill -0 "$side23" 2> /dev/null; }; do
  sleep 5
done
echo "queue over at $(date -u +%T)"
