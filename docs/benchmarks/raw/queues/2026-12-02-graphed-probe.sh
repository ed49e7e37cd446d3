# The float8 linear probe timed on the step captured in a CUDA graph (trainers/levers/timing.py
# `graphed`), on nvidia-h200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit). At ab82c12 (2026-12-02) the Qwen1.5-0.5B cold job's
# second stage enqueued float8_linears=none on a predicted +143.43 ms a step, against a whole
# step of 113 ms that then ran the same (70.6 and 70.9 samples/s): each 1024-wide linear timed as
# launched sat near the host's floor (0.8 ms bf16, 1.2 ms float8 on 2026-11-30's records at
# 2048 x 512). First the GPU tests of the capture (about 1 minute), then each linear shape of the
# Qwen1.5-0.5B and llama-1b shapes timed graphed and as launched (benchmarks/float8_shapes.py
# --launched), to set the probe's new figures beside the old.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
python -m pytest -q -m gpu -p no:cacheprovider -rA tests/trainers/test_float8_linears_lever.py \
  -k "captured or probe_times" --junitxml="$QUEUE_OUT/gpu_tests.xml" > "$QUEUE_OUT/gpu_tests.log" 2>&1
echo "gpu tests ended with $? at $(date -u +%T)"
python benchmarks/float8_shapes.py --presets hf:causal-lm:llama-1b --launched --model-arg arch=qwen2 \
  --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16 --model-arg kv_heads=16 \
  --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true --model-arg seq=2048 \
  --model-arg batch=8 --tag qwen15 --commit "$commit" --out "$QUEUE_OUT" > "$QUEUE_OUT/shapes-qwen15.log" 2>&1
echo "qwen15 shapes ended with $? at $(date -u +%T)"
python benchmarks/float8_shapes.py --presets hf:causal-lm:llama-1b --launched --model-arg seq=2048 \
  --model-arg batch=8 --tag llama-1b --commit "$commit" --out "$QUEUE_OUT" > "$QUEUE_OUT/shapes-llama-1b.log" 2>&1
echo "llama-1b shapes ended with $? at $(date -u +%T)"
