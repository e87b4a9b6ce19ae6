#!/usr/bin/env bash
# One paper's GPU window (issue [7/7] item 6): run it in a lent GPU session after
# `WINDOW=N bash scripts/gpu_check.sh`, as one command of at most 8 min on one H200, offline,
# nothing downloaded (carry dist/wheels). It writes the paper's JSON under ${OUT:-runs/gpu_paper}.
# Rotation, one paper per lent GPU session, in this order (docs/plan.md, "GPU windows"):
#   tre -> reflectrm -> mgs -> consistrm -> compression -> tre ...
# Built: tre (scripts/repro/tre_drift_gpu.py: a policy trained inside the command, then the
# registered bonus-only drift, docs/exploration.md) and compression (scripts/repro/
# compression_gpu.py: a decoder LM trained inside the command on a corpus with known priors, then
# the carry-first size comparison, docs/compressor.md) and consistrm (reproduce.py's gpu-window
# preset: a judge trained from random weights inside the command, then the cpu-varied gate and
# arms, seed after seed, docs/grm.md) and reflectrm (scripts/repro/reflectrm_gpu.py: a judge taught
# every question's arithmetic inside the command, the planted-pairs gate, then reflective vs
# majority on contested rows, docs/grm.md) and mgs (scripts/repro/mgs_gpu.py: a policy trained
# inside the command, then the measurement study's gate, batches and primary, docs/multidomain.md).
# Usage: bash scripts/gpu_paper.sh PAPER
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PYTHON:-python3} DIR=${OUT:-runs/gpu_paper}
case ${1:-} in
  tre) SCRIPT=scripts/repro/tre_drift_gpu.py NAME=exploration_drift_gpu ;;
  compression) SCRIPT=scripts/repro/compression_gpu.py NAME=compressor_gpu ;;
  consistrm) SCRIPT=scripts/reproduce.py NAME=grm_consistrm_gpu_window ;;
  reflectrm) SCRIPT=scripts/repro/reflectrm_gpu.py NAME=grm_reflectrm_gpu ;;
  mgs) SCRIPT=scripts/repro/mgs_gpu.py NAME=multidomain_gpu ;;
  *) echo "usage: bash scripts/gpu_paper.sh tre|reflectrm|mgs|consistrm|compression" >&2; exit 2 ;;
esac
bash scripts/gpu_check.sh 1 || exit 1  # the wheels into /tmp/site, the GPU's name (40 s at most)
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$DIR"
if [ "$1" = consistrm ]; then  # seed after seed: the record is rewritten after each
  WORK=/tmp/$NAME END=$((SECONDS + 420))
  for seeds in "0" "0 1" "0 1 2"; do
    LEFT=$((END - SECONDS)); [ "$LEFT" -gt 20 ] || break
    # shellcheck disable=SC2086  # the seeds are separate arguments
    timeout "$LEFT" $PY "$SCRIPT" consistrm --preset gpu-window --seeds $seeds --out "$WORK" \
      --docs "$DIR" || break
  done
  # the pre-check's and every finished run's record (a stopped run's too), beside the summary
  (cd "$WORK" && find . -name '*.json' -not -path '*warm-judge*' | tar -cf - -T -) | tar -xf - -C "$DIR"
  exit 0
fi
timeout 420 $PY "$SCRIPT" --work "/tmp/$NAME" --out "$DIR/$NAME.json"
