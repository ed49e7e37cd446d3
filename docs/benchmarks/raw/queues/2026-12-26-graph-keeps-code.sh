# A whole-step CUDA graph keeps and is kept from like the step without it (trainers.keeps_code):
# its GPU tests first, then the gate's planted-fault and replay GPU tests at the change.
# tools/device_queue.sh; carry [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the
# literal commit. About 6 minutes of one H200.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
echo "$commit" > "$QUEUE_OUT/commit.txt"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
export CUDA_VISIBLE_DEVICES=0
python -m pytest -q -m gpu -p no:cacheprovider -rA --junitxml="$QUEUE_OUT/graph_keeps.xml" \
  tests/trainers/test_float8_gpu.py -k "whole_step or compiled_inside or eager_twins_code" \
  tests/trainers/test_gate_gpu.py \
  > "$QUEUE_OUT/graph_keeps.log" 2>&1
echo "graph tests ended with $? at $(date -u +%T)"
python -m pytest -q -m gpu -p no:cacheprovider tests/trainers/test_gate_gpu.py \
  tests/tuner/search/test_isolated.py -rA --junitxml="$QUEUE_OUT/gate_gpu.xml" \
  > "$QUEUE_OUT/gate_gpu.log" 2>&1
echo "gate tests ended with $? at $(date -u +%T)"
