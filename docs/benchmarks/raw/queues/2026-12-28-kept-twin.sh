# The kept check (tuner.search.gating.kept: a graph config and its eager twin run where the
# trial compiled, with the process's own kernels, and the child judges them where they agree)
# on the GPU, then issue 55's two 0.5B rows with it and the fifty-first session's fixes
# (62f9559, 3db772b; the fifty-first session's queue of these rows never ran and is gone).
# tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the
# literal commit. First (about 5 minutes) its GPU tests: the planted faults all leave the kept
# bits and a correct compiled graph keeps them (transformer small fp32, hf:causal-lm tiny bf16),
# and the check through the gate's child (convnet tiny, bf16 against fp32); then the gate's
# planted-fault and replay tests whole. Then each row (about 12 minutes each):
# benchmarks/time_to_answer.py, a default job (float8 allowed) from empty Inductor and Triton
# caches and empty storage, a repeat job in a new process with empty caches given only the
# first job's SQLite file and artefacts file, one interleaved round of the two picks.
# The Qwen2-style decoder (0.49B, vocabulary 151,936): at e3c3c83 786 s cold (twin 123 s of it),
# 210 s repeat; expected about 400 s cold before profiles and about 165 s repeat. Then
# (QUEUE_QWEN15=0 leaves it out) the Qwen1.5-0.5B shape: at d8153cc 529 s cold, 160 s repeat,
# before the graph stage. A device call comes back about 35-70 s after its command ends: make
# the next `wait` at once (on 2026-12-04 a third call found the machine gone).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/kept.xml" \
  tests/trainers/test_gate_gpu.py -k "process_kernels" \
  tests/tuner/search/test_isolated.py -k "eager_twins_bits" \
  > "$QUEUE_OUT/kept.log" 2>&1
echo "kept tests ended with $? at $(date -u +%T)"
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/gate_gpu.xml" \
  tests/trainers/test_gate_gpu.py -k "not process_kernels" > "$QUEUE_OUT/gate_gpu.log" 2>&1
echo "gate tests ended with $? at $(date -u +%T)"
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
tta() {  # tag, then the model's arguments
  local tag=$1; shift
  mapfile -t passed < <(as_job "$@" --model-arg seq=2048 --model-arg batch=8)
  python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
    --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
    --out "$QUEUE_OUT" --tag "$tag" > "$QUEUE_OUT/tta-$tag.log" 2>&1
  echo "$tag ended with $? at $(date -u +%T)"
}
tta qwen2 --model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 \
  --model-arg heads=14 --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 \
  --model-arg tie=true
[[ ${QUEUE_QWEN15:-1} == 1 ]] || exit 0
tta qwen15 --model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 \
  --model-arg heads=16 --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 \
  --model-arg tie=true
