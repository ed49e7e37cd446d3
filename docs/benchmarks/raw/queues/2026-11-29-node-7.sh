# Issue 52 on a lent machine of 4 GPUs (`nvidia-h100-x4` or `nvidia-h200-x4`; ask `status`), with
# tools/device_queue.sh: the `llama-1b` node pair again (the sixth run, 2026-11-28-node-6-h200x4.sh
# at 370eb22: 356 s on 4 H200s against 697 s on one, 0.51x), now with each worker's phase lines
# timed in its log, the host's cores split among the workers' Inductor compile workers, and the
# gate's config run left to an idle worker while the gating one runs the eager twin. GPUs
# 1-3 stay idle until the one-GPU job has ended; beside the interleaved round on GPU 0, GPU 1 runs
# the attention microbenchmark again (its first run replayed the Llama calls in float32).
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
commit=${STREAMTUNE_COMMIT:?the commit measured}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.cuda.device_count(), torch.cuda.nccl.version(), torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1

python benchmarks/node.py --presets hf:causal-lm:llama-1b --precisions bf16-autocast,float8 \
  --gpus "$gpus" --rounds 1 --commit "$commit" --out "$QUEUE_OUT" --tag llama-1b \
  > "$QUEUE_OUT/node_llama.log" 2>&1 &
node=$!
echo "node_llama started $(date -u +%T)"
while kill -0 "$node" 2> /dev/null && [[ ! -f $QUEUE_OUT/node-llama-1b-gpus1-recommendation.json ]]; do
  sleep 5
done
echo "one-GPU job over (or node.py ended) at $(date -u +%T)"
CUDA_VISIBLE_DEVICES=1 python benchmarks/attention.py --commit "$commit" --out "$QUEUE_OUT" \
  --presets hf:causal-lm:llama-1b,hf:causal-lm:llama-1b-large,transformer:medium \
  > "$QUEUE_OUT/attention.log" 2>&1
echo "attention ended with $? at $(date -u +%T)"
wait "$node"
echo "node_llama ended with $? at $(date -u +%T)"
