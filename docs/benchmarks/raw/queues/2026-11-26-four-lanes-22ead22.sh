# Issues 34 and 32 on one host of four H100s (tools/device_queue.sh), commit 22ead22: four lanes
# side by side, each on a GPU of its own (CUDA_VISIBLE_DEVICES) with its own Inductor and Triton
# caches, so every lane compiles from a cold cache as a user's first run does. Each lane's
# measurements are interleaved within its own process; no figure compares across lanes. A machine
# of several GPUs goes back after 30 minutes held, so each lane is planned to end within ~25.
#   lane 0: float8 allowed, llama-1b (8 x 2048), against the bf16 and float8 peers (issue 34)
#   lane 1: the same on llama-1b-large (16 x 2048) (issue 34)
#   lane 2: the default job on llama-1b-large to its end, then the scale peers against its
#           recommendation (issue 32; its run at 306d389 lost its machine in the final round)
#   lane 3: peak memory of the README's ResNet-18, GPT-2 and BERT peers rows (issue 32); the float8
#           GPU tests; float8 allowed on the probe's 126M Llama-style shape (issue 34's 125M record)
commit=22ead22
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao; print(torch.__version__, torch.version.cuda, torchao.__version__, torch.cuda.device_count())' > "$QUEUE_OUT/versions.txt" 2>&1

f8_job=(--precisions bf16-autocast --allow-precisions float8 --parity-steps 200 --protocol 3,4,4
  --final-rounds 1 --rounds 2 --search-timeout 240 --commit $commit --out "$QUEUE_OUT")
readme_config='{"num_streams":2,"sync_interval":10,"sync_mode":"event","prefetch_depth":2,"pin_memory":true,"non_blocking":true,"num_workers":0,"cuda_graph":true,"compile":"default","optimizer":"fused"}'

lane0() {
  python benchmarks/peers.py --presets hf:causal-lm:llama-1b "${f8_job[@]}" --tag llama-1b-float8
}
lane1() {
  python benchmarks/peers.py --presets hf:causal-lm:llama-1b-large "${f8_job[@]}" --tag llama-1b-large-float8
}
lane2() {
  python benchmarks/default_job.py --workload hf:causal-lm --preset llama-1b-large \
    --precision bf16-autocast --runs cold --aim-cold 900 --tag llama-1b-large-$commit \
    --commit $commit --out "$QUEUE_OUT" --scratch /tmp/queue/dj-l1b-large
  local cache
  cache=$(find /tmp/queue/dj-l1b-large -type d -name inductor-cache | head -1)
  TORCHINDUCTOR_CACHE_DIR=${cache:-$TORCHINDUCTOR_CACHE_DIR} python benchmarks/peers.py \
    --presets hf:causal-lm:llama-1b-large --precisions bf16-autocast --protocol 3,5,6 --rounds 2 \
    --recommendation "$(ls "$QUEUE_OUT"/default-job-*-llama-1b-large-$commit.json)" \
    --tag llama-1b-large-bf16-$commit --commit $commit --out "$QUEUE_OUT"
}
lane3() {
  python benchmarks/peers.py --presets torchvision:resnet18:default --model-arg batch=128 \
    --model-arg image=32 --model-arg classes=10 --precisions bf16-autocast \
    --peers pytorch-idiom,compile-reduce-overhead --protocol 2,2,5 --rounds 1 \
    --config "$readme_config" --tag readme-memory-resnet18 --commit $commit --out "$QUEUE_OUT"
  python benchmarks/peers.py --presets hf:causal-lm:default,hf:masked-lm:default \
    --precisions bf16-autocast --peers pytorch-idiom,compile-reduce-overhead --protocol 2,2,5 \
    --rounds 1 --config "$readme_config" --tag readme-memory-hf --commit $commit --out "$QUEUE_OUT"
  python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_gpu.py \
    --junitxml "$QUEUE_OUT/float8-gpu-tests.xml"
  python benchmarks/peers.py --presets hf:causal-lm:llama-350m --model-arg layers=4 \
    --model-arg batch=4 "${f8_job[@]}" --tag llama-126m-float8
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
