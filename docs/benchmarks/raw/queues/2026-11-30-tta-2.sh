# Issue 55 on one lent GPU (any kind; with tools/device_queue.sh), after the repeat job began to
# copy the cold study's trials (tuner/search/earlier.py): the time to an answer at `llama-1b`
# (bf16, float8 allowed, the default job), cold, then as a repeat job given only the cold job's
# SQLite file and artefacts file, then one interleaved round of the two picks; then, if time is
# left, the profile child's compile at 16 layers with the recommended config's own loop settings
# (a cold run fills the cache, then a profile through the tuner's child). At 27dc687 on one H200
# the cold job took 765 s and the repeat 426 s (121 s of it trials, 156 s the recommended
# config's profile).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --commit "$commit" --out "$QUEUE_OUT" --tag llama-1b \
  > "$QUEUE_OUT/tta.log" 2>&1
echo "time_to_answer ended with $? at $(date -u +%T)"
mkdir -p "$QUEUE_OUT/profile-cache"
CUDA_VISIBLE_DEVICES=0 python benchmarks/diagnose_profile_cache.py --workload hf:causal-lm \
  --preset llama-1b --precision float8 --modes run,tuner-child --out "$QUEUE_OUT/profile-cache" \
  --config '{"num_streams": 2, "sync_interval": 10, "sync_mode": "event", "prefetch_depth": 2, "pin_memory": true, "non_blocking": true, "num_workers": 2, "cuda_graph": false, "compile": "default", "optimizer": "fused", "micro_batches": 1, "activation_checkpointing": "none", "checkpoint_share": 1.0, "compile_scope": "model", "parallel": "none", "bucket_cap_mb": 25, "gradient_as_bucket_view": false, "static_graph": false, "reshard_after_forward": true, "fsdp_prefetch": false, "attention": "default"}' \
  > "$QUEUE_OUT/profile-cache.log" 2>&1
echo "diagnose_profile_cache ended with $? at $(date -u +%T)"
