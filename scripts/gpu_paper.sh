#!/usr/bin/env bash
# One paper's GPU window (issue [7/7] item 6): run it in a lent GPU session after
# `WINDOW=N bash scripts/gpu_check.sh`, as one command of at most 8 min on one H200, offline,
# nothing downloaded (carry dist/wheels). It writes the paper's JSON under ${OUT:-runs/gpu_paper}.
# Rotation, one paper per lent GPU session, in this order (docs/plan.md, "GPU windows"):
#   tre -> reflectrm -> mgs -> consistrm -> compression -> tre ...
# Built: tre (scripts/repro/tre_drift_gpu.py: a policy trained inside the command, then the
# registered bonus-only drift, docs/exploration.md). The other four are refused with the reason.
# Usage: bash scripts/gpu_paper.sh PAPER
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PYTHON:-python3} DIR=${OUT:-runs/gpu_paper}
case ${1:-} in
  tre) ;;
  reflectrm|mgs|consistrm|compression)
    echo "gpu_paper.sh: $1 has no GPU window yet (docs/plan.md, GPU windows): run tre" >&2
    exit 2 ;;
  *) echo "usage: bash scripts/gpu_paper.sh tre|reflectrm|mgs|consistrm|compression" >&2; exit 2 ;;
esac
bash scripts/gpu_check.sh 1 || exit 1  # the wheels into /tmp/site, the GPU's name (40 s at most)
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$DIR"
timeout 420 $PY scripts/repro/tre_drift_gpu.py --work /tmp/tre_drift_gpu \
  --out "$DIR/exploration_drift_gpu.json"
