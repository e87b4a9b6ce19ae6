#!/usr/bin/env bash
# One prepared check of the GPU paths on a single CUDA GPU with no network access (< 8 min):
#   1. the `gpu`-marked tests (PPO; the judges incl. ReflectRM, the Bradley-Terry RM, PPO on an RM
#      and on a judge);
#   2. a bf16 PPO step benchmark on a random 0.5B-class Qwen2 (tokens/s, MFU);
#   3. a DeepSpeed ZeRO-2 PPO fast_dev_run on the tiny config.
# Installs nothing from the network: run it in a venv that already has the package (`pip install
# -e .` from wheels carried over), or pass WHEELS=dir to install from local wheels only.
# Usage: bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python}
if [[ -n "${WHEELS:-}" ]]; then
  $PY -m pip install -q --no-index --find-links "$WHEELS" -e ".[dev]" || exit 1
fi
status=0
echo "## gpu tests"
timeout 180 $PY -m pytest -q -m gpu -p no:cacheprovider tests/gpu || status=1
echo "## PPO step benchmark (bf16, random Qwen2 0.5B-class)"
timeout 180 $PY scripts/gpu_benchmark.py --steps 3 || status=1
echo "## DeepSpeed ZeRO-2 on one GPU (fast_dev_run)"
if [[ -f configs/trainer/deepspeed_zero2.yaml ]]; then
  timeout 120 $PY -m lit_rlhf.cli fit --config configs/ppo/countdown_tiny.yaml \
    --config configs/trainer/deepspeed_zero2.yaml --trainer.devices=1 \
    --trainer.fast_dev_run=true && echo "| ZeRO-2 | ok |" || { echo "| ZeRO-2 | FAILED |"; status=1; }
else
  echo "| ZeRO-2 | skipped: configs/trainer/deepspeed_zero2.yaml missing |"
fi
exit $status
