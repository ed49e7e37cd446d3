#!/usr/bin/env bash
# The gate's GPU evidence (issue 28) within one 10-minute device call: the planted faults alone
# on the GPU first (their provocations are timing races, so no other process shares the GPU
# then), then the equivalent configs in three processes side by side (their verdicts are bit
# comparisons and envelopes, which sharing the GPU cannot change; only the probes' ms/step can),
# then one merged result. Usage: benchmarks/gate_evidence.sh COMMIT OUT [SEEDS]
set -uo pipefail
commit=$1
out=$2
seeds=${3:-20}
parts=$out/parts
mkdir -p "$parts"
run() {
  local name=$1
  shift
  python benchmarks/gate_power.py --device cuda --evidence --runs "$seeds" --commit "$commit" \
    --out "$parts" --name "$name" "$@" >"$parts/$name.log" 2>&1
}
controls=control:missing-wait,control:missing-record-stream,control:stale-graph-input
faulty=transformer@small,convnet@small
run faults --models "$faulty" --fault-models "$faulty" --fault-runs "$seeds" --configs "$controls" \
  --max-seconds 270
llama=hf:causal-lm@tiny+arch=llama+precision=bf16-autocast
run bert --models hf:masked-lm@tiny --fault-models hf:masked-lm@tiny --fault-runs 0 \
  --max-seconds 230 &
run decoders --models "$llama,hf:causal-lm@tiny" --fault-models "$llama" --fault-runs 0 \
  --max-seconds 230 &
run others --models transformer@tiny,timm:resnet10t@tiny --fault-models transformer@tiny \
  --fault-runs 0 --max-seconds 230 &
wait
python benchmarks/gate_power_report.py "$parts"/{faults,bert,decoders,others}.json \
  --out "$out" --name "gate-h100-$(date -u +%F)"
