# Issue 55 on nvidia-h200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit): the search's gate with the loop twin as its default and
# a compiled config's own run owed no bits made in the search's process, where its trial's code
# is kept (`runs_where_trained`), instead of in the gate's child, which compiled it again
# (benchmarks/compile_reuse.py at 384c19e: 132 s cold, 67 s from the trial's disk cache in a new
# process). One row: issue 54's fifth held-out decoder, the Qwen1.5-0.5B shape (0.46B,
# vocabulary 151,936; 900 s cold and 393 s repeat at 46a3e5a, whose gates took 180 s and 66 s),
# benchmarks/time_to_answer.py: a default job (float8 allowed) from empty Inductor and Triton
# caches and empty storage, then a repeat job in a new process with empty caches given only the
# first job's SQLite file and artefacts file, then one interleaved round of the two picks.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
mapfile -t passed < <(as_job "${qwen15[@]}")
python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
  --out "$QUEUE_OUT" --tag qwen15 > "$QUEUE_OUT/tta-qwen15.log" 2>&1
echo "qwen15 ended with $? at $(date -u +%T)"
