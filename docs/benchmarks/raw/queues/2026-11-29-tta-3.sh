# Issue 55 on one lent GPU (with tools/device_queue.sh): the time to an answer at `llama-1b`
# (bf16, float8 allowed, the default job), cold, then as a repeat job given only the cold job's
# SQLite file and artefacts file, then one interleaved round of the two picks. Since 27dc687
# (cold 765 s, repeat 426 s on one H200): the repeat copies the cold study's trials, a run of the
# config the process just compiled keeps Dynamo's code (the final round after the trial), and the
# profiles' child builds the workload beside the final round.
set -x
commit=${STREAMTUNE_COMMIT:?the commit measured}
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv > "$QUEUE_OUT/nvidia-smi.csv"
python -c 'import torch, torchao, transformers; print(torch.__version__, torch.version.cuda, torchao.__version__, transformers.__version__, torch.backends.cudnn.version())' > "$QUEUE_OUT/versions.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 python benchmarks/time_to_answer.py --presets hf:causal-lm:llama-1b \
  --precisions bf16-autocast,float8 --rounds 1 --commit "$commit" --out "$QUEUE_OUT" --tag llama-1b \
  > "$QUEUE_OUT/tta.log" 2>&1
echo "time_to_answer ended with $? at $(date -u +%T)"
