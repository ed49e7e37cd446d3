# The GPU tests of the gate shared among a `--gpus N` job's workers (tuner/service/gatehelp.py),
# on one host of four H100s after the llama-1b node run (2026-11-28-node-3.sh) lost its machine:
# a child's verdict with the envelope measured apart equals the one measured whole, bit for bit
# on CUDA; a real `--gpus all` job with screening on has its idle workers gate; and the lever
# module's cuDNN attention case (tests/trainers/test_lever_module.py).
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,driver_version --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.device_count())' > "$QUEUE_OUT/versions.txt" 2>&1
python -m pytest -m gpu -v -p no:cacheprovider --junitxml "$QUEUE_OUT/gpu-tests.xml" \
  "tests/tuner/search/test_isolated.py::test_a_child_gives_the_same_verdict_with_the_envelope_measured_apart" \
  tests/tuner/test_cli_gpus.py::test_on_real_gpus_a_worker_with_no_trial_left_gates_while_the_others_run \
  tests/trainers/test_lever_module.py > "$QUEUE_OUT/gpu-tests.log" 2>&1
echo "pytest ended with $?"
