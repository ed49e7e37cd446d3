# Issues 54 and 55 on one H200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit). About 25 minutes of one GPU.
# 1. Issue 54's fifth row again, the Qwen1.5-0.5B shape, a default job, now that the scale space's
#    second stage tries a whole-step CUDA graph over each capturable leader (92222b4: 1.04x over
#    the compiled float8 step at this shape). At b553055 (2026-12-01) the row reached 1.05x
#    (1.04-1.06) the fastest peer, 1,049 s of the queue. Its profiles' progress line gives the
#    profiles' child's FX-graph cache hits and misses.
# 2. Issue 55: why the recommended config's profile compiles cold in its child. A small cold job
#    (the Qwen2-style shape with 4 layers, so that logging every key's hash details costs little)
#    with `--profile all`, Inductor's FX-graph cache keys logged in every process (children
#    inherit TORCH_LOGS); each key's components kept with the process id, for a diff of a key
#    the child missed against the measuring process's key of the same graph. Cut at 300 s.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
unset TUNER_COMPILE_CACHE TUNER_ARTIFACTS
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor-row TRITON_CACHE_DIR=/tmp/queue/triton-row
peers=compile-fused,compile-per-layer,torchtitan,float8-compile,float8-per-layer
row=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --allow-precisions float8
  --trials 40 --profile baselines --peers $peers --rounds 2 --peer-protocol 4,8,4
  --commit "$commit" --out "$QUEUE_OUT" --model-arg seq=2048 --model-arg batch=8)
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true)
python benchmarks/peers.py "${row[@]}" "${qwen15[@]}" --tag beyond-qwen1.5-0.5b \
  > "$QUEUE_OUT/beyond-qwen1.5-0.5b.log" 2>&1
echo "row ended with $? at $(date -u +%T)"
# The small job: caches of its own, empty; Inductor's own default folder for the job's artefacts.
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor-keys TRITON_CACHE_DIR=/tmp/queue/triton-keys
small=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=4 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
job=/tmp/queue/keys-job
rm -rf "$job" && mkdir -p "$job"
TORCH_LOGS="+torch._inductor.codecache" timeout 300 python -m tuner run --workload hf:causal-lm \
  --preset llama-1b --device cuda --storage "sqlite:///$job/study.db" --json --profile all \
  --precisions bf16-autocast,float8 "${small[@]}" > "$QUEUE_OUT/keys-job-recommendation.json" \
  2> "$job/stderr.log"
echo "keys job ended with $? at $(date -u +%T)"
grep -v 'codecache.py' "$job/stderr.log" > "$QUEUE_OUT/keys-job.log"
grep -E 'codecache.py:[0-9]+\] .*(hash details for key|fx graph cache|\] \[[a-z0-9]{51}\] )' \
  "$job/stderr.log" | grep -v '\] gm: ' | cut -c1-600 | gzip > "$QUEUE_OUT/keys-job-components.txt.gz"
# The graphs' text too, one digest per key and process, to tell which graphs differ.
grep -E 'codecache.py:[0-9]+\] .*\] gm: ' "$job/stderr.log" | awk '{print $3, $6, length($0)}' \
  > "$QUEUE_OUT/keys-job-gm-lines.txt" || true
rm -rf "$job"
