# The second device queue of the session (tools/device_queue.sh), at commit 4c6ac75: the
# ResNet-50 peers record (the first queue's was lost with its machine), then issue 29's default
# jobs again, ResNet-50 (batch 64, 224 px) and GPT-2 124M, each cold then warm, with the final
# round that also stops when its first round decides as the search did.
set -x
commit=4c6ac75
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python benchmarks/peers.py --presets torchvision:resnet50:default --model-arg batch=64 \
  --precisions bf16-autocast --trials 6 --search-timeout 120 --rounds 2 --tag resnet50-bf16 \
  --commit $commit --out "$QUEUE_OUT"
python benchmarks/default_job.py --workload torchvision:resnet50 --preset default \
  --model-arg batch=64 --precision bf16-autocast --tag resnet50 --commit $commit \
  --reference "$QUEUE_OUT/peers-h100-$(date -u +%F)-resnet50-bf16.json" \
  --out "$QUEUE_OUT" --scratch /tmp/queue/dj-resnet50
python benchmarks/default_job.py --workload hf:causal-lm --preset default \
  --precision bf16-autocast --reference docs/benchmarks/peers-h100-2026-11-24-all-merged.json \
  --tag gpt2 --commit $commit --out "$QUEUE_OUT" --scratch /tmp/queue/dj-gpt2
