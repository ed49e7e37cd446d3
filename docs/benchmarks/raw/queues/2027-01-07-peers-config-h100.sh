# Issues 54 and 55 on an H100: the five scale peers of each row measured interleaved with the
# config its default job recommended on an H100, given whole by --config, so issue 55's "within
# 2 % of the fastest peer" has its H100 figure without a second tuning job (10-15 minutes
# a row with two peers, not 16 as a tuning job). Rows (PEER_ROWS, in order; default "qwen15"):
#   qwen15   Qwen1.5-0.5B shape, trial-13 of time-to-answer-h100-2026-12-06-qwen15-431a0f4
#   qwen2    Qwen2-style 494M, trial-13 of time-to-answer-h100-2026-12-06-qwen2-08bfeb2
#   llama-1b the preset, the pick of time-to-answer-h100-2026-12-05-llama-1b (c1bf87b)
# tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the
# literal commit. PEER_SET: the peers (default the five scale peers); on a short lease,
# compile-fused,float8-compile, the two fastest on every earlier H100 row of these models
# (10-15 minutes a row with these two on 2026-12-07: the seed baseline, one ablation config
# per lever and float8-compile's setup run in each)
# (peers-h100-2026-11-26-heldout-qwen2-0.5b, -2026-11-27-heldout-llama-1b, the Qwen1.5 partial).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
feed='"num_streams":2,"sync_interval":10,"sync_mode":"event","prefetch_depth":2,"pin_memory":true,"non_blocking":true,"num_workers":2'
step='"compile":"default","optimizer":"fused","micro_batches":1,"activation_checkpointing":"none","checkpoint_share":1.0,"compile_scope":"model","parallel":"none","attention":"default","kernels":"torch","loss":"model"'
head_only="{$feed,\"cuda_graph\":false,$step,\"float8_head\":\"float8\",\"float8_linears\":\"none\"}"
every_linear="{$feed,\"cuda_graph\":true,$step,\"float8_head\":\"float8\",\"float8_linears\":\"all\"}"
peers() {  # tag, config, then the model's arguments
  local tag=$1 config=$2
  shift 2
  python benchmarks/peers.py --presets hf:causal-lm:llama-1b --precisions bf16-autocast \
    --peers ${PEER_SET:-compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer} \
    --rounds 2 --peer-protocol 4,8,4 --config "$config" --config-precision float8 \
    --commit "$commit" --out "$QUEUE_OUT" --model-arg seq=2048 --model-arg batch=8 "$@" \
    --tag "$tag" > "$QUEUE_OUT/peers-$tag.log" 2>&1
  echo "$tag ended with $? at $(date -u +%T)"
}
for row in ${PEER_ROWS:-qwen15}; do
  case $row in
    qwen15) peers beyond-qwen1.5-0.5b-config "$head_only" --model-arg arch=qwen2 \
      --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16 --model-arg kv_heads=16 \
      --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true ;;
    qwen2) peers beyond-qwen2-0.5b-config "$every_linear" --model-arg arch=qwen2 \
      --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14 --model-arg kv_heads=2 \
      --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true ;;
    llama-1b) peers beyond-llama-1b-config "$every_linear" ;;
    *) echo "unknown row $row (allowed: qwen15, qwen2, llama-1b)"; exit 2 ;;
  esac
done
