# Issue 55 on one lent GPU (with tools/device_queue.sh): where the recommended config's profile
# spends its time at `llama-1b` (float8, the whole model compiled, the loop settings of the
# 2026-11-28 answers). A cold run fills one Inductor cache folder; the tuner's own profile child
# then profiles the config (its Profile.phases: build, compile, run, trace; TORCH_LOGS prints its
# FX-graph cache hits and misses into the log); then two runs in one process, the second timed:
# whether a run of the config just compiled keeps Dynamo's code at 1B (trainers.compilation
# reuse_key). At 27dc687 the job's profile of this config took 126 s in its child.
set -x
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
mkdir -p "$QUEUE_OUT/profile-cache"
CUDA_VISIBLE_DEVICES=0 python benchmarks/diagnose_profile_cache.py --workload hf:causal-lm \
  --preset llama-1b --precision float8 --modes run,tuner-child,again --out "$QUEUE_OUT/profile-cache" \
  --config '{"num_streams": 2, "sync_interval": 10, "sync_mode": "event", "prefetch_depth": 2, "pin_memory": true, "non_blocking": true, "num_workers": 2, "cuda_graph": false, "compile": "default", "optimizer": "fused", "micro_batches": 1, "activation_checkpointing": "none", "checkpoint_share": 1.0, "compile_scope": "model", "parallel": "none", "bucket_cap_mb": 25, "gradient_as_bucket_view": false, "static_graph": false, "reshard_after_forward": true, "fsdp_prefetch": false, "attention": "default"}' \
  > "$QUEUE_OUT/profile-cache.log" 2>&1
echo "diagnose_profile_cache ended with $? at $(date -u +%T)"
