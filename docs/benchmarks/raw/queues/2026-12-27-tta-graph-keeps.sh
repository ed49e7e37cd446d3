# Issue 55's two 0.5B rows with a whole-step graph that keeps and is kept from like the step
# without it (62f9559) and draws held against a graph incumbent's own leader (3db772b).
# tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the
# literal commit. Each row: benchmarks/time_to_answer.py, a default job (float8 allowed) from
# empty Inductor and Triton caches and empty storage, then a repeat job in a new process with
# empty caches given only the first job's SQLite file and artefacts file, then one interleaved
# round of the two picks.
# First (about 12 minutes) the Qwen2-style decoder (0.49B, vocabulary 151,936): at e3c3c83 786 s
# cold (the graph led; its trial, the gate's config run and both finalists compiled again, and
# two draws ran that its leader had answered: about 270 s by the log), 210 s repeat. Expected:
# about 520 s cold before profiles, which the time rule then fits inside 600 s, and about 165 s
# repeat. Then (about 12 minutes; QUEUE_QWEN15=0 leaves it out)
# the Qwen1.5-0.5B shape: at d8153cc 529 s cold, 160 s repeat, before the graph stage.
# A device call comes back about 35-70 s after its command ends: make the next `wait` at once
# (on 2026-12-04 a third call found the machine gone after two of 570 s).
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
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
