#!/usr/bin/env bash
# Superseded by `branchgate bench` (the whole experiment, cached, with report.json/report.md and a plot);
# kept as a thin shell over `branchgate simulate` for re-running the README's older table by hand.
# Closed loop on held-out queries: no pruning, the learned gate (at its τ and at the τ values in GATE_TAUS,
# to meet the teachers' token budgets), teachers at pre-retrieval, the gate combined with later-stage
# teachers, and equal-budget shallow searches. Prints one summary line per configuration; then
#   python benchmarks/closed_loop_compare.py OUT_DIR            (paired intervals against the gate)
#   bash benchmarks/closed_loop.sh ENV_DIR CONTROLLER.onnx QUERY_IDS_FILE OUT_DIR ["SHALLOW_NODES..."]
# GATE_TAUS (default "0.05 0.02") sets the extra gate thresholds.
set -euo pipefail
ENV=$1; G=$2; Q=$3; OUT=$4; SHALLOW=${5:-"14 24"}
run() {  # name pre post synth
  branchgate simulate --env "$ENV" --queries "$Q" --out "$OUT/$1" --pre "$2" --post "$3" --synth "$4" \
    --encoder packaged --seed 0 --no-progress 2>/dev/null | tail -1
}
run none-none-none none none none
run gate-none-none "gate:$G" none none
for tau in ${GATE_TAUS:-0.05 0.02}; do run "gate_tau$tau" "gate:$G,tau=$tau" none none; done
for t in mmr sc dpp; do run "$t-none-none" "$t" none none; done
run gate-sc-cd "gate:$G" sc cd
for n in $SHALLOW; do run "shallow_$n" "shallow:$n" none none; done
