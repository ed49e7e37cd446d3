# Issue 55 on nvidia-h200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit): does a compiled float8 config's run in another process
# reuse what its trial compiled? benchmarks/compile_reuse.py on the Qwen1.5-0.5B shape's leader
# (the config its job gated at 46a3e5a: the gate's run compiled 136 s in the gate's child against
# the trial's 132 s), each candidate in a new process on one new cache folder: the trial, the
# same again, the gate's own run without and with strict determinism, and the loop twin's order.
# About 8 minutes of one GPU.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=16
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
leader=sync_interval=10,sync_mode=event,num_streams=2,prefetch_depth=2,pin_memory=true
leader+=,non_blocking=true,num_workers=2,compile=default,optimizer=fused,float8_head=float8
python benchmarks/compile_reuse.py --workload hf:causal-lm --preset llama-1b "${qwen15[@]}" \
  --precision float8 --reference-precision bf16-autocast --config "$leader" --steps 6 \
  --commit "$commit" --out "$QUEUE_OUT" --tag qwen15 > "$QUEUE_OUT/compile-reuse.log" 2>&1
echo "compile_reuse ended with $? at $(date -u +%T)"
