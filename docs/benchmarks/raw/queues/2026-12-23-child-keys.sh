# Issue 55 on one H200 (tools/device_queue.sh; carry [".whl", ".whl-tt"]; STREAMTUNE_COMMIT the
# literal commit): the second half of 2026-12-22-graph-row-child-keys.sh alone, after its machine
# went back with the row unfinished (its search had ended: the log is kept beside this queue's).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
unset TUNER_COMPILE_CACHE TUNER_ARTIFACTS
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
