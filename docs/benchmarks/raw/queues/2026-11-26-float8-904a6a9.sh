# Issue 34 on one host of four H100s (tools/device_queue.sh), commit 904a6a9: four lanes side by
# side, each on a GPU of its own (CUDA_VISIBLE_DEVICES) with its own cold Inductor and Triton
# caches. Each lane's measurements are interleaved within its own process; no figure compares
# across lanes. The machine goes back after 30 minutes held, so each lane is planned to end
# within ~24.
#   lane 0: float8 allowed on llama-1b (8 x 2048): the job's two whole-model corners, bf16 then
#           float8 (200-step cross-precision gate), then the bf16 and float8 peers
#   lane 1: the same at 126M (llama-350m cut to 4 layers, 4 x 2048), all four compile corners,
#           the tuner's own measurement protocol; then the float8 GPU tests
#   lane 2: llama-1b-large (16 x 2048): the job's float8 trial's gate alone (its whole job does
#           not fit in one lent machine: the reference needs recomputation there)
#   lane 3: llama-1b-large: that float8 config against the bf16 and float8 peers; then the
#           gate's GPU tests
commit=904a6a9
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao; print(torch.__version__, torch.version.cuda, torchao.__version__, torch.cuda.device_count())' > "$QUEUE_OUT/versions.txt" 2>&1

peers=compile-fused,compile-per-layer,float8-compile,float8-per-layer
f8_job=(--precisions bf16-autocast --allow-precisions float8 --precision-parity-steps 200
  --final-rounds 1 --peers $peers --commit $commit --out "$QUEUE_OUT")
# The config the job's float8 trial runs on the 1B presets: the first scale corner (the whole
# model compiled) on the corners' feed (tuner/search/stages.py).
f8_config='{"num_streams":2,"sync_interval":10,"sync_mode":"event","prefetch_depth":2,"pin_memory":true,"non_blocking":true,"num_workers":0,"cuda_graph":false,"compile":"default","optimizer":"fused","compile_scope":"model"}'

lane0() {
  python benchmarks/peers.py --presets hf:causal-lm:llama-1b "${f8_job[@]}" --trials 2 \
    --protocol 3,4,4 --rounds 2 --search-timeout 1500 --tag llama-1b-float8-$commit
}
lane1() {
  python benchmarks/peers.py --presets hf:causal-lm:llama-350m --model-arg layers=4 \
    --model-arg batch=4 "${f8_job[@]}" --trials 4 --rounds 3 --search-timeout 900 \
    --tag llama-126m-float8-$commit
  python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_gpu.py \
    --junitxml "$QUEUE_OUT/float8-gpu-tests.xml"
}
lane2() {
  python benchmarks/precision_gate.py --workload hf:causal-lm --preset llama-1b-large \
    --precision bf16-autocast --config-precision float8 --config "$f8_config" \
    --parity-steps 20 --precision-parity-steps 200 --commit $commit --out "$QUEUE_OUT" \
    --tag llama-1b-large-float8-$commit
}
lane3() {
  python benchmarks/peers.py --presets hf:causal-lm:llama-1b-large --precisions bf16-autocast \
    --peers $peers,torchtitan --config "$f8_config" --config-precision float8 --protocol 3,4,4 \
    --rounds 2 --tag llama-1b-large-float8-$commit --commit $commit --out "$QUEUE_OUT"
  python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py \
    --junitxml "$QUEUE_OUT/gate-gpu-tests.xml"
}

for lane in 0 1 2 3; do
  (
    export CUDA_VISIBLE_DEVICES=$lane
    export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor-$lane TRITON_CACHE_DIR=/tmp/queue/triton-$lane
    echo "lane $lane started $(date -u +%T)"
    set -x
    lane$lane > "$QUEUE_OUT/lane$lane.log" 2>&1
    echo "lane $lane ended with $? at $(date -u +%T)"
  ) &
done
wait
