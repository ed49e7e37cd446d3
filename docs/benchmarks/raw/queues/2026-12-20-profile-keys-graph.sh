# Two questions on one H200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit). About 20 minutes of one GPU. A device call comes back
# about 70 s after its command ends: make the next `wait` at once.
# 1. Issue 55: why the recommended config's profile compiles cold in its child (131 s of the
#    Qwen2-style cold job at 7660099). The same cold job, with Inductor's FX-graph cache logging
#    every key's hash details in every process (the children inherit TORCH_LOGS); the components
#    of each key are kept (the graphs' text left out) for a diff of the trial's keys against the
#    profile child's, and the profile's progress line gives its FX-graph hits and misses.
# 2. Issue 54: a whole-step CUDA graph over the compiled float8 step, which the scale space fixes
#    off ("about 1 % at 1.1B"), where the recommended config's profile found the GPU idle 5.6 % of
#    the Qwen2-style step. The config given (the scale space's feed, whole model compiled, fused
#    optimizer, float8) with `cuda_graph` on, against the `float8 + compile` peer, which runs the
#    same step without the graph, interleaved: at the Qwen1.5-0.5B shape, then at `llama-1b`.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR TUNER_COMPILE_CACHE TUNER_ARTIFACTS
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
job=/tmp/queue/keys-job
rm -rf "$job" && mkdir -p "$job"
TORCH_LOGS="+torch._inductor.codecache" python -m tuner run --workload hf:causal-lm \
  --preset llama-1b --device cuda --storage "sqlite:///$job/study.db" --json \
  --precisions bf16-autocast,float8 "${qwen2[@]}" > "$QUEUE_OUT/keys-job-recommendation.json" \
  2> "$job/stderr.log"
echo "keys job ended with $? at $(date -u +%T)"
# Progress lines whole; of the hash details, each key's components (one line each, with the
# process id), not the graphs' text.
grep -v 'codecache.py' "$job/stderr.log" > "$QUEUE_OUT/keys-job.log"
grep -E 'codecache.py:[0-9]+\] .*(hash details for key|fx graph cache (hit|miss)|\] \[[a-z0-9]{51}\] )' \
  "$job/stderr.log" | grep -v '\] gm: ' | cut -c1-600 | gzip > "$QUEUE_OUT/keys-job-components.txt.gz"
rm -rf "$job"
peers=(--presets hf:causal-lm:llama-1b --precisions bf16-autocast --peers float8-compile
  --rounds 2 --peer-protocol 4,8,4 --profile none --config '{"cuda_graph": true}'
  --config-base scale --config-precision float8 --commit "$commit" --out "$QUEUE_OUT"
  --model-arg seq=2048 --model-arg batch=8)
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true)
python benchmarks/peers.py "${peers[@]}" "${qwen15[@]}" --tag graph-float8-qwen1.5-0.5b \
  > "$QUEUE_OUT/graph-float8-qwen1.5-0.5b.log" 2>&1
echo "qwen1.5 graph ended with $? at $(date -u +%T)"
python benchmarks/peers.py "${peers[@]}" --tag graph-float8-llama-1b \
  > "$QUEUE_OUT/graph-float8-llama-1b.log" 2>&1
echo "llama-1b graph ended with $? at $(date -u +%T)"
