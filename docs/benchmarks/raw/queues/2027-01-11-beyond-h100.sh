# Issue 54's rows on one H100 (nvidia-h100-x1), one row a machine start: the default job that
# may choose float8, then the five scale peers and the ablation, interleaved (benchmarks/peers.py,
# as the H200 rows of raw/queues/2026-12-0*-beyond-*.sh). tools/device_queue.sh; carry [".whl",
# ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit; BEYOND_ROWS picks the rows,
# in order, from: llama-1b llama-1b-large llama3.2-1b pythia-1b gpt2-large qwen1.5-0.5b
# (default: llama-1b). A row took about 25-30 minutes on an H200 (tuning up to 900 s, then the
# peers' two rounds): start it at once on a fresh machine and call `wait` back to back.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--precisions bf16-autocast --allow-precisions float8
  --trials 40 --profile baselines --peers $peers --rounds 2 --peer-protocol 4,8,4
  --commit "$commit" --out "$QUEUE_OUT")
shape=(--model-arg seq=2048 --model-arg batch=8)
for name in ${BEYOND_ROWS:-llama-1b}; do
  case $name in
    llama-1b) args=(--presets hf:causal-lm:llama-1b) ;;  # its own shape, as the H200 row
    llama-1b-large) args=(--presets hf:causal-lm:llama-1b-large) ;;
    llama3.2-1b) args=(--presets hf:causal-lm:llama-1b "${shape[@]}" --model-arg arch=llama
      --model-arg hidden=2048 --model-arg layers=16 --model-arg heads=32 --model-arg kv_heads=8
      --model-arg ffn=8192 --model-arg vocab=128256 --model-arg tie=true) ;;
    pythia-1b) args=(--presets hf:causal-lm:llama-1b "${shape[@]}" --model-arg arch=gpt_neox
      --model-arg hidden=2048 --model-arg layers=16 --model-arg heads=8 --model-arg kv_heads=0
      --model-arg ffn=8192 --model-arg vocab=50304) ;;
    gpt2-large) args=(--presets hf:causal-lm:llama-1b "${shape[@]}" --model-arg arch=gpt2
      --model-arg hidden=1280 --model-arg layers=36 --model-arg heads=20 --model-arg kv_heads=0
      --model-arg ffn=5120 --model-arg vocab=50257) ;;
    qwen1.5-0.5b) args=(--presets hf:causal-lm:llama-1b "${shape[@]}" --model-arg arch=qwen2
      --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16 --model-arg kv_heads=16
      --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true) ;;
    *) echo "unknown row $name"; continue ;;
  esac
  python benchmarks/peers.py "${row[@]}" "${args[@]}" --tag "beyond-$name" \
    > "$QUEUE_OUT/beyond-$name.log" 2>&1
  echo "beyond-$name ended with $? at $(date -u +%T)"
done
