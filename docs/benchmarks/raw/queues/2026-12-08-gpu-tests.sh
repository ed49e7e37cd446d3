# Issues 54 and 55 on nvidia-h200 (tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first
# call; STREAMTUNE_COMMIT the literal commit): the GPU tests that the final round's kept compiled
# code (trainers.compilation.keeping_compiled) and the float8 levers touch, with Inductor and
# Triton caches of their own, empty: the gate's planted faults (issue 55 asks them to keep
# passing), float8 (among them float8 beside bf16, each keeping its code) and the two float8
# lever modules.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/queue/inductor TRITON_CACHE_DIR=/tmp/queue/triton
for name in gate_gpu float8_gpu float8_head_lever float8_linears_lever; do
  python -m pytest -q -m gpu -p no:cacheprovider "tests/trainers/test_$name.py" -rA \
    --junitxml="$QUEUE_OUT/$name.xml" > "$QUEUE_OUT/$name.log" 2>&1
  echo "tests/trainers/test_$name.py ended with $? at $(date -u +%T)"
done
