# Issue 32 on one H100 (tools/device_queue.sh), commit 2f2b1e5 (306d389, peers.py's --config and
# the FLOP count's attention formula): the scale peers on the 1.1B preset whose plain step does not fit
# (16 x 2048 tokens), against the config the default job's search found fastest there. That job
# (2026-11-26-llama-1b-large-306d389.sh) lost its machine in its final round, 556 s in (log:
# docs/benchmarks/raw/default-job-h100-2026-11-26-llama-1b-large-306d389/); its trial 1, the
# whole model compiled with fused AdamW, ran 38.0 samples/s against 37.3 for each block compiled.
# The device time left (725 s) bought no second job: this measures that trial's config, labelled
# as given.
set -x
commit=2f2b1e5
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python benchmarks/peers.py --presets hf:causal-lm:llama-1b-large --precisions bf16-autocast \
  --protocol 2,4,5 --rounds 2 --config '{"num_streams":2,"sync_interval":10,"sync_mode":"event","prefetch_depth":2,"pin_memory":true,"non_blocking":true,"num_workers":0,"cuda_graph":false,"compile":"default","optimizer":"fused","micro_batches":1,"activation_checkpointing":"none","checkpoint_share":1.0,"compile_scope":"model","parallel":"none","bucket_cap_mb":25,"gradient_as_bucket_view":false,"static_graph":false,"reshard_after_forward":true,"fsdp_prefetch":false}' \
  --tag llama-1b-large-bf16 --commit $commit --out "$QUEUE_OUT"
