# The device queue of 2026-11-25 (tools/device_queue.sh): issue 29's default jobs on one H100,
# GPT-2 124M then ResNet-50 (batch 64, 224 px), each cold then warm, then the ResNet-50 peers
# record the second one is compared with. Code measured: commit 1ff1856.
set -x
commit=1ff1856
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python benchmarks/default_job.py --workload hf:causal-lm --preset default \
  --precision bf16-autocast --reference docs/benchmarks/peers-h100-2026-11-24-all-merged.json \
  --tag gpt2 --commit $commit --out "$QUEUE_OUT" --scratch /tmp/queue/dj-gpt2
python benchmarks/default_job.py --workload torchvision:resnet50 --preset default \
  --model-arg batch=64 --precision bf16-autocast --tag resnet50 --commit $commit \
  --out "$QUEUE_OUT" --scratch /tmp/queue/dj-resnet50
python benchmarks/peers.py --presets torchvision:resnet50:default --model-arg batch=64 \
  --precisions bf16-autocast --trials 6 --search-timeout 120 --rounds 2 --tag resnet50-bf16 \
  --commit $commit --out "$QUEUE_OUT"
