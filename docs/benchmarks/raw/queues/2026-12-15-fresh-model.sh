# Issue 55 on nvidia-h200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit). At ab82c12 (2026-12-02) the Qwen1.5-0.5B cold job took
# 632 s: its gate's config run compiled the leader again (22 s) because the search's model had
# run a per-block trial, whose undo left `_compiled_call_impl = None` on each decoder layer, a
# key Dynamo guards and the gate's fresh model has not; the final round then compiled both
# finalists again (24 s and 52 s). From 1629390 a run leaves every module's `__dict__` as a fresh
# model's, and the float8 probes time the step captured in a CUDA graph (the Qwen1.5 shape's
# `float8_linears` probe said +143 ms a step timed as launched; graphed, +3.0 ms).
# First (about 15 minutes) the Qwen1.5-0.5B row cold and repeat: expected near 550 s cold (the
# gate's run and both finalists on kept code), an estimate. Then (about 12 minutes;
# QUEUE_LLAMA=0 leaves it out) the llama-1b row cold and repeat, last measured at c8b23c3
# (536 s and 146 s), before the held corner, the probes and the second stage's float8 levers.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
mapfile -t passed < <(as_job "${qwen15[@]}")
python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
  --out "$QUEUE_OUT" --tag qwen15 > "$QUEUE_OUT/tta-qwen15.log" 2>&1
echo "qwen15 ended with $? at $(date -u +%T)"
[[ ${QUEUE_LLAMA:-1} == 1 ]] || exit 0
python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 --commit "$commit" --out "$QUEUE_OUT" \
  --tag llama-1b > "$QUEUE_OUT/tta-llama-1b.log" 2>&1
echo "llama-1b ended with $? at $(date -u +%T)"
