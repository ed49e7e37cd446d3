# Issue 54's llama-1b row in two machine starts, as starts that fail leave no session the ~25
# minutes a whole row takes: this start runs the default job alone, as a user types it
# (benchmarks/default_job.py: `python -m tuner run ... --json` in its own process, profiles and
# all, timed by phase), on an H100; a later start measures its recommendation against the five
# peers with the ablation (`benchmarks/peers.py --recommendation <this record>`). On any other
# card: test_levers_gpu.py whole (2027-01-16-levers-gpu.sh). tools/device_queue.sh; carry
# [".whl", ".whl-tt"] on the first call; STREAMTUNE_COMMIT the literal commit.
set -x
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $card != *H100* ]]; then
  source docs/benchmarks/raw/queues/2027-01-16-levers-gpu.sh
  exit
fi
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
echo "commit $commit" >> "$QUEUE_OUT/versions.txt"
export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$(nproc)
python benchmarks/default_job.py --workload hf:causal-lm --preset llama-1b \
  --precision bf16-autocast --runs cold --aim-cold 900 --commit "$commit" \
  --out "$QUEUE_OUT" --tag beyond-llama-1b-job --scratch /tmp/queue/scratch \
  -- --precisions bf16-autocast,float8 > "$QUEUE_OUT/default-job.log" 2>&1
echo "default job ended with $? at $(date -u +%T)"
