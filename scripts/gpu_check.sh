#!/usr/bin/env bash
# One prepared check of the GPU paths on a single CUDA GPU with no network access (< 9 min: the
# step timeouts add up to 150 + 120 + 90 + 120 + 60 = 540 s):
#   0. the GPU's name and memory (nvidia-smi, where present);
#   1. the `gpu`-marked tests (PPO; the judges incl. ReflectRM, the Bradley-Terry RM, PPO on an RM
#      and on a judge);
#   2. a bf16 PPO step benchmark on a random 0.5B-class Qwen2 (tokens/s, MFU);
#   3. a DeepSpeed ZeRO-2 PPO fast_dev_run on the tiny config;
#   4. the preset dry runs on the GPU (tests/test_preset_dry_run.py with
#      LIT_RLHF_DRY_RUN_DEVICE=gpu: every GPU preset, one step, with its own DeepSpeed fragment,
#      bf16, tiny stand-in models and the offline samples; about 30 s on a CPU);
#   5. the packed against the padded update step (scripts/bench_packing.py, mid-llama, budgets
#      1024 and 4096: on the GPU the attention kernel decides how the budget pays).
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
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total --format=csv
fi
echo "## gpu tests"
timeout 150 $PY -m pytest -q -m gpu -p no:cacheprovider tests/gpu || status=1
echo "## PPO step benchmark (bf16, random Qwen2 0.5B-class)"
timeout 120 $PY scripts/gpu_benchmark.py --steps 3 || status=1
echo "## DeepSpeed ZeRO-2 on one GPU (fast_dev_run)"
if [[ -f configs/trainer/deepspeed_zero2.yaml ]]; then
  timeout 90 $PY -m lit_rlhf.cli fit --config configs/ppo/countdown_tiny.yaml \
    --config configs/trainer/deepspeed_zero2.yaml --trainer.devices=1 \
    --trainer.fast_dev_run=true && echo "| ZeRO-2 | ok |" || { echo "| ZeRO-2 | FAILED |"; status=1; }
else
  echo "| ZeRO-2 | skipped: configs/trainer/deepspeed_zero2.yaml missing |"
fi
echo "## preset dry runs on the GPU"
LIT_RLHF_DRY_RUN_DEVICE=gpu timeout 120 $PY -m pytest -q -rs -p no:cacheprovider \
  tests/test_preset_dry_run.py::test_preset_dry_run || status=1
echo "## packed vs padded update step (mid-llama)"
for budget in 1024 4096; do
  timeout 30 $PY scripts/bench_packing.py --repeats 2 --micro-batch-tokens $budget || status=1
done
exit $status
