# Issue 32 on one H100 (tools/device_queue.sh), commit 57b5f8d: peak memory beside MFU for the README's
# peers rows, which were measured before runs recorded it. Each preset's two README peers (the
# PyTorch idiom, compile reduce-overhead) and the config every one of them was recommended
# (docs/benchmarks/peers-h100-2026-11-26-all-merged.json), given with --config: one short round,
# for the memory, not the timing (the timings stay those of the interleaved runs of 2026-11-23/24).
# The session's last 261 s of device time: the presets cheapest to compile first.
set -x
commit=57b5f8d
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python benchmarks/peers.py --presets convnet:small,transformer:small,transformer:medium,transformer:large \
  --precisions bf16-autocast --peers pytorch-idiom,compile-reduce-overhead --protocol 2,2,5 --rounds 1 \
  --config '{"num_streams":2,"sync_interval":10,"sync_mode":"event","prefetch_depth":2,"pin_memory":true,"non_blocking":true,"num_workers":0,"cuda_graph":true,"compile":"default","optimizer":"fused"}' --tag readme-memory --commit $commit --out "$QUEUE_OUT"
