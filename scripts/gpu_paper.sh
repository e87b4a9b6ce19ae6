#!/usr/bin/env bash
# One paper's GPU window (issue [7/7] item 6): run it in a lent GPU session after
# `WINDOW=N bash scripts/gpu_check.sh`, as one command of at most 8 min on one H200, offline,
# nothing downloaded (carry dist/wheels). It writes the paper's JSON under ${OUT:-runs/gpu_paper}.
# Rotation, one paper per lent GPU session, in this order (docs/plan.md, "GPU windows"):
#   tre -> reflectrm -> mgs -> consistrm -> compression -> tre ...
# Built: tre (scripts/repro/tre_drift_gpu.py: a policy trained inside the command, then the
# registered bonus-only drift, docs/exploration.md) and compression (scripts/repro/
# compression_gpu.py: a decoder LM trained inside the command on a corpus with known priors, then
# the carry-first size comparison, docs/compressor.md). The other three are refused with the reason.
# Usage: bash scripts/gpu_paper.sh PAPER
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PYTHON:-python3} DIR=${OUT:-runs/gpu_paper}
case ${1:-} in
  tre) SCRIPT=scripts/repro/tre_drift_gpu.py NAME=exploration_drift_gpu ;;
  compression) SCRIPT=scripts/repro/compression_gpu.py NAME=compressor_gpu ;;
  reflectrm|mgs|consistrm)
    echo "gpu_paper.sh: $1 has no GPU window yet (docs/plan.md, GPU windows): run tre or compression" >&2
    exit 2 ;;
  *) echo "usage: bash scripts/gpu_paper.sh tre|reflectrm|mgs|consistrm|compression" >&2; exit 2 ;;
esac
bash scripts/gpu_check.sh 1 || exit 1  # the wheels into /tmp/site, the GPU's name (40 s at most)
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$DIR"
timeout 420 $PY "$SCRIPT" --work "/tmp/$NAME" --out "$DIR/$NAME.json"
