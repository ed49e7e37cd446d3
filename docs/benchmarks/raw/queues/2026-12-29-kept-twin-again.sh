# The kept check (tuner.search.gating.kept) on the GPU again, then issue 55's two 0.5B rows.
# The fifty-fourth session's run of 2026-12-28-kept-twin.sh (at aaed237) ran its GPU test with
# two -k options, of which pytest keeps the last: the process_kernels tests never ran, and the
# kept test failed at 3 steps, shorter than a graph's warm-up (fixed since: the gate refuses such
# steps, the test runs past it). Its Qwen2-style row: 735 s cold (twin 191 s in the child, the
# reason not said then; the gate's line says it since), 184 s repeat; every compile 1.5x its
# time at e3c3c83 on that machine. tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first
# call; STREAMTUNE_COMMIT the literal commit. First the Qwen2-style row (about 12 minutes; at
# e3c3c83 it ran first too, at aaed237 after the GPU tests), then the kept GPU tests (about 5
# minutes), the gate's planted-fault and replay tests whole, then the Qwen1.5 row
# (QUEUE_QWEN15=0 leaves it out). Make each `wait` at once: a call comes back 35-70 s
# after its command ends.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
# The host's CPUs and load: compiles are CPU-bound, and at aaed237 every compile took 1.5x its
# time at e3c3c83 on an H200 host whose CPU was not recorded.
{ lscpu; cat /proc/loadavg; free -g; } > "$QUEUE_OUT/host.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
tta() {  # tag, then the model's arguments
  local tag=$1; shift
  echo "before $tag: $(cat /proc/loadavg)" >> "$QUEUE_OUT/host.txt"
  mapfile -t passed < <(as_job "$@" --model-arg seq=2048 --model-arg batch=8)
  python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
    --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
    --out "$QUEUE_OUT" --tag "$tag" > "$QUEUE_OUT/tta-$tag.log" 2>&1
  echo "$tag ended with $? at $(date -u +%T)"
}
tta qwen2 --model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 \
  --model-arg heads=14 --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 \
  --model-arg tie=true
# One -k: pytest keeps the last of several.
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/kept.xml" \
  tests/trainers/test_gate_gpu.py tests/tuner/search/test_isolated.py \
  -k "process_kernels or eager_twins_bits" > "$QUEUE_OUT/kept.log" 2>&1
echo "kept tests ended with $? at $(date -u +%T)"
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/gate_gpu.xml" \
  tests/trainers/test_gate_gpu.py -k "not process_kernels" > "$QUEUE_OUT/gate_gpu.log" 2>&1
echo "gate tests ended with $? at $(date -u +%T)"
[[ ${QUEUE_QWEN15:-1} == 1 ]] || exit 0
tta qwen15 --model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 \
  --model-arg heads=16 --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 \
  --model-arg tie=true
