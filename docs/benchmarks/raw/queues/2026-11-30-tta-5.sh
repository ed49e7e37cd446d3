# Issues 54 and 55 on one lent GPU (with tools/device_queue.sh): first the GPU tests of the
# float8_head lever (a float8 run's head converted too, under both compile scopes; a head float8
# cannot take refused), of the kernels lever (a tiny Llama through liger-kernel's kernels, its
# gate verdict) and of the profiles' warm-up, then the time to an answer on two held-out
# decoders of 0.4-1.5B (the Qwen2-style and Mistral-style rows of the 2026-11-27 held-out table),
# each cold, then as a repeat job given only the cold job's SQLite file and artefacts file, then
# one interleaved round of the two picks. At c8b23c3 on one H200 `llama-1b` took 536 s cold and
# 146 s repeat (docs/benchmarks/time-to-answer-h200-2026-11-29-llama-1b-c8b23c3.md). About 15
# minutes of a machine per decoder. The `wait` calls may carry the README GPU install's wheel
# folders (tools/keep_torch_wheels.sh) one per call, the last running tests/test_lock.py.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers, liger_kernel, importlib.metadata as m; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version(), m.version("liger-kernel"))' > "$QUEUE_OUT/versions.txt" 2>&1
# TTA_GPU_TESTS and TTA_ROWS: another queue running this one after its own tests, on fewer rows.
# TTA_GPU_TESTS=none: no tests (a lane beside another that runs them). QUEUE_GPU: the GPU.
gpu=${QUEUE_GPU:-0}
read -ra tests <<< "${TTA_GPU_TESTS:-tests/trainers/test_float8_head_lever.py tests/trainers/test_kernels_lever.py tests/tuner/search/test_warm_profiles.py}"
if [[ ${tests[*]} != none ]]; then
  CUDA_VISIBLE_DEVICES=$gpu python -m pytest -q -m gpu -p no:cacheprovider "${tests[@]}" -rA \
    --junitxml="$QUEUE_OUT/gpu-tests-tta.xml" > "$QUEUE_OUT/gpu-tests-tta.log" 2>&1
  echo "gpu tests ended with $? at $(date -u +%T)"
fi
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
qwen2=(--model-arg arch=qwen2 --model-arg hidden=896 --model-arg layers=24 --model-arg heads=14
  --model-arg kv_heads=2 --model-arg ffn=4864 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
mistral=(--model-arg arch=mistral --model-arg hidden=1536 --model-arg layers=28
  --model-arg heads=12 --model-arg kv_heads=4 --model-arg ffn=6144 --model-arg vocab=32000
  --model-arg seq=2048 --model-arg batch=8)
for row in ${TTA_ROWS:-qwen2 mistral}; do
  declare -n margs=$row
  mapfile -t passed < <(as_job "${margs[@]}")
  CUDA_VISIBLE_DEVICES=$gpu python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
    --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
    --out "$QUEUE_OUT" --tag "$row" > "$QUEUE_OUT/tta-$row.log" 2>&1
  echo "time_to_answer $row ended with $? at $(date -u +%T)"
done
