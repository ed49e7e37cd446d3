# Issue 47 on one H100 (tools/device_queue.sh): first a short scale-space job on a development
# model (the 4-layer cut of llama-350m, 126M: not held out), to see screening, prediction and the
# deferred gate run on a GPU before any held-out model is spent; then the held-out models, each a
# default tuning job that may choose float8 (no --trials beyond the CLI's 40, no search timeout,
# profiles as a default job takes them), measured against the user's loops interleaved.
#
# The held-out models (chosen before the search was changed, first run here; none is a preset and
# none was used while developing): a Qwen2-style 0.5B (Qwen2-0.5B's shape: 151,936-token
# vocabulary, tied head), a GPT-NeoX-style 0.4B (Pythia-410m's shape) and a Mistral-style 1.07B
# of a depth and width no preset has (28 layers of 1536). 8 x 2048 tokens a step each.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__)' > "$QUEUE_OUT/versions.txt" 2>&1

# The development job: the scale space named (126M is under the scale threshold), bf16 or float8.
python -m tuner run --workload hf:causal-lm --preset llama-350m --model-arg layers=4 \
  --model-arg batch=4 --space scale --precisions bf16-autocast,float8 --device cuda \
  --timeout 150 --final-rounds 1 --profile none --storage "sqlite:///$QUEUE_OUT/dev.db" --json \
  > "$QUEUE_OUT/dev-job.json" 2> "$QUEUE_OUT/dev-job.log"

peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--precisions bf16-autocast --allow-precisions float8 --trials 40 --profile baselines
  --peers $peers --peer-protocol 4,4,4 --rounds 2 --commit "$commit" --out "$QUEUE_OUT")
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
neox=(--model-arg arch=gpt_neox --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg ffn=4096 --model-arg vocab=50304 --model-arg seq=2048 --model-arg batch=8)
python benchmarks/peers.py --presets hf:causal-lm:default "${qwen2[@]}" "${row[@]}" \
  --tag heldout-qwen2-0.5b > "$QUEUE_OUT/heldout-qwen2.log" 2>&1
python benchmarks/peers.py --presets hf:causal-lm:default "${neox[@]}" "${row[@]}" \
  --tag heldout-neox-0.4b > "$QUEUE_OUT/heldout-neox.log" 2>&1
