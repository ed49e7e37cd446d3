# Issue 55 on nvidia-h200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit). At 0920146 (2026-12-02) the Qwen1.5-0.5B cold job took
# 898 s: its final round 354 s, where each turn of the two float8 finalists compiled again
# (trial-12 33 s and 31 s, trial-11 59 s and 66 s, against about 10 s on kept code) and the gate's
# run of trial-11 made where its trial compiled took 63 s. The same sequence keeps every turn's
# code on the CPU. From 67d939d a run says why it dropped kept code and logs the guard that failed
# when it ran kept code and compiled anyway.
# First (about 5 minutes): that sequence alone (benchmarks/kept_turns.py), the two finalists'
# configs taking turns twice with the gate's run of each after its first turn; its record names
# the rule or the guard. Then the float8 GPU test whose stale expectation failed at 0920146.
# Then (about 15 minutes; QUEUE_TTA=0 leaves it out) the Qwen1.5-0.5B row cold and repeat again,
# whose final-round lines now say how long each turn compiled and why, under the 600 s aim of
# c92073a (900 s before): expected a cold job near 620 s with every turn compiling again (the
# tied config's gate and the second round cut), near 560 s where the turns keep their code.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
finalists=num_streams=2,sync_interval=10,sync_mode=event,prefetch_depth=2,pin_memory=true
finalists+=,non_blocking=true,num_workers=2,compile=default,optimizer=fused,float8_head=float8
python benchmarks/kept_turns.py --preset llama-1b "${qwen15[@]}" --precision float8 \
  --config "$finalists" --turns "float8_linears=all;float8_linears=none" --rounds 2 \
  --steps 20 --commit "$commit" --out "$QUEUE_OUT" --tag qwen15 > "$QUEUE_OUT/kept-turns.log" 2>&1
echo "kept turns ended with $? at $(date -u +%T)"
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_gpu.py -rA \
  -k "seed_to_seed_envelope or taking_turns" --junitxml="$QUEUE_OUT/gpu_tests.xml" \
  > "$QUEUE_OUT/gpu_tests.log" 2>&1
echo "gpu tests ended with $? at $(date -u +%T)"
[[ ${QUEUE_TTA:-1} == 1 ]] || exit 0
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
mapfile -t passed < <(as_job "${qwen15[@]}")
python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
  --out "$QUEUE_OUT" --tag qwen15 > "$QUEUE_OUT/tta-qwen15.log" 2>&1
echo "qwen15 ended with $? at $(date -u +%T)"
