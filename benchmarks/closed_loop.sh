#!/usr/bin/env bash
# Closed loop on held-out queries: no pruning, the learned gate, teachers at pre-retrieval, the gate combined
# with later-stage teachers, and an equal-budget shallow search. Prints one summary line per configuration.
#   bash benchmarks/closed_loop.sh ENV_DIR CONTROLLER.onnx QUERY_IDS_FILE OUT_DIR [SHALLOW_NODES]
set -euo pipefail
ENV=$1; G=$2; Q=$3; OUT=$4; SHALLOW=${5:-14}
for cfg in "none none none" "gate:$G none none" "mmr none none" "sc none none" "dpp none none" \
           "gate:$G sc cd" "shallow:$SHALLOW none none"; do
  set -- $cfg
  name=$(echo "$1-$2-$3" | sed 's#gate:[^-]*#gate#g; s#:#_#g')
  branchgate simulate --env "$ENV" --queries "$Q" --out "$OUT/$name" --pre "$1" --post "$2" --synth "$3" \
    --encoder packaged --seed 0 --no-progress 2>/dev/null | tail -1
done
