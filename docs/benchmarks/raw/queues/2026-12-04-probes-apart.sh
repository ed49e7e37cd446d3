# Issue 55 on nvidia-h200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call;
# STREAMTUNE_COMMIT the literal commit). At 2c9259f (2026-12-02) the Qwen1.5-0.5B cold job took
# 822 s: the gate's run of the leader was made in the gate's child (166 s, a compile beside the
# profiles' warm-up) and the leader compiled again in the final round (47 s), while
# benchmarks/kept_turns.py showed the same sequence keeping every turn's code on the GPU
# (3.7-4.0 s a turn). What came between in the job: the second stage's float8_linears probe,
# whose torch.compiler.reset() dropped the leader's kept code. From 7d0b8c1 the probes compile on
# code objects of their own (trainers/kept_code.py, compile_apart) and leave it kept.
# First (about 3 minutes): the GPU tests of that (a float8 run, both float8 probes, the run
# again compiling nothing) and of the probes themselves on float8 holders. Then (about 15
# minutes; QUEUE_TTA=0 leaves it out) the Qwen1.5-0.5B row cold and repeat again: expected
# near 620 s cold (the gate's run about 13 s, the final round's leader kept), an estimate.
# Last (about 4 minutes; QUEUE_GATE=0 leaves it out): the gate's planted-fault GPU tests and the
# gate's child, last run at d137197 (23 of 23), since when the kept code moved to its own module.
# Since 2026-12-02 (38th session) the job's log also says how long building the workload and
# choosing its space took ("workload built ... in N s"): at 2c9259f 23 s went there unexplained;
# and the second stage's line gives each enqueued variant's predicted gain.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
python -m pytest -q -m gpu -p no:cacheprovider -rA \
  tests/trainers/test_float8_gpu.py tests/trainers/test_float8_linears_lever.py \
  tests/trainers/test_float8_head_lever.py -k "probe or taking_turns" \
  --junitxml="$QUEUE_OUT/gpu_tests.xml" > "$QUEUE_OUT/gpu_tests.log" 2>&1
echo "gpu tests ended with $? at $(date -u +%T)"
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
mapfile -t passed < <(as_job "${qwen15[@]}")
[[ ${QUEUE_TTA:-1} == 1 ]] && python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
  --out "$QUEUE_OUT" --tag qwen15 > "$QUEUE_OUT/tta-qwen15.log" 2>&1
echo "qwen15 ended with $? at $(date -u +%T)"
[[ ${QUEUE_GATE:-1} == 1 ]] || exit 0
python -m pytest -q -m gpu -p no:cacheprovider -rA tests/trainers/test_gate_gpu.py \
  tests/tuner/search/test_isolated.py --junitxml="$QUEUE_OUT/gate_tests.xml" \
  > "$QUEUE_OUT/gate_tests.log" 2>&1
echo "gate tests ended with $? at $(date -u +%T)"
