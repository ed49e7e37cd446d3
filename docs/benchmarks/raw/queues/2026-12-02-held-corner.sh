# Issues 54 and 55 on nvidia-h200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first
# call; STREAMTUNE_COMMIT the literal commit). What changed since the Qwen1.5-0.5B row at 583f50a
# (cold 880 s: compile 469 s, of which three whole-model float8 trials of 139, 122 and 57 s;
# profiles 115 s, of which 94 s waiting for the warm-up after the gate):
# - the first stage's float8 corner of the whole model is held until the float8 corner of each
#   block is complete, then enqueued with the head in float8 where its probe predicts a gain
#   (tuner/search/proposing/held.py): expected the plain float8 corner's compile (139 s) gone;
# - the profiles' warm-up still running when the gate ends is ended, not waited for
#   (Children.end_warm): expected no wait between the gate and the final round;
# - the repeat job does not measure the copied configs again (measured_before) and its final
#   round aims at 240 s.
# Check in the cold log: "first stage: the float8 corner of the whole model with ..." after the
# float8 corner of each block; "profiles: the leader's compile ... ended unfinished" (or the
# warm-up ended first); the repeat's "not run: trial N, copied from an earlier job".
# First (about 4 minutes): the float8 and compile GPU tests, since torch.nn's own layers now compile
# per block from a frame of ours (trainers/recompute.py; test_a_copy_of_the_build_keeps_the_float8_
# compiled_code[blocks] runs that on the transformer workload), and the warm-up tests.
# Then one row, as before: the Qwen1.5-0.5B shape (0.46B, vocabulary 151,936), default jobs cold
# and repeat (benchmarks/time_to_answer.py), then one interleaved round of the two picks.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
as_job() { for a in "$@"; do printf -- '--job-arg=%s\n' "$a"; done; }
qwen15=(--model-arg arch=qwen2 --model-arg hidden=1024 --model-arg layers=24 --model-arg heads=16
  --model-arg kv_heads=16 --model-arg ffn=2816 --model-arg vocab=151936 --model-arg tie=true
  --model-arg seq=2048 --model-arg batch=8)
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_float8_gpu.py \
  tests/trainers/test_compile.py tests/tuner/search/test_warm_profiles.py -rA \
  --junitxml="$QUEUE_OUT/gpu_tests.xml" > "$QUEUE_OUT/gpu_tests.log" 2>&1
echo "gpu tests ended with $? at $(date -u +%T)"
mapfile -t passed < <(as_job "${qwen15[@]}")
python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 "${passed[@]}" --commit "$commit" \
  --out "$QUEUE_OUT" --tag qwen15 > "$QUEUE_OUT/tta-qwen15.log" 2>&1
echo "qwen15 ended with $? at $(date -u +%T)"
