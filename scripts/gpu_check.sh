#!/usr/bin/env bash
# One prepared check of the GPU paths on a single CUDA GPU with no network access (the step
# timeouts add up to 150 + 120 + 90 + 120 + 60 + 120 = 660 s: run steps 1-4 and 5-6 as two calls
# where one command may take at most 10 min, e.g. `bash scripts/gpu_check.sh 1 2 3 4`):
#   0. the GPU's name and memory (nvidia-smi, where present);
#   1. the `gpu`-marked tests (PPO; the judges incl. ReflectRM, the Bradley-Terry RM, PPO on an RM
#      and on a judge);
#   2. a bf16 PPO step benchmark on a random 0.5B-class Qwen2 (tokens/s, MFU);
#   3. a DeepSpeed ZeRO-2 PPO fast_dev_run on the tiny config;
#   4. the preset dry runs on the GPU (tests/test_preset_dry_run.py with
#      LIT_RLHF_DRY_RUN_DEVICE=gpu: every GPU preset, one step, with its own DeepSpeed fragment,
#      bf16, tiny stand-in models and the offline samples; about 30 s on a CPU);
#   5. the packed against the padded update step (scripts/bench/packing.py, mid-llama, budgets
#      1024 and 4096: on the GPU the attention kernel decides how the budget pays);
#   6. on-policy against one-step-off training (scripts/bench/overlap.py, mid-llama, the vLLM
#      engine where vLLM imports, else HF generate): steps per minute and the hidden share.
# Installs nothing from the network: run it in a venv that already has the package (`pip install
# -e .` from wheels carried over), or pass WHEELS=dir to install from local wheels only.
# Usage: bash scripts/gpu_check.sh [STEP ...]   (no step: all of them)
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python}
if [[ -n "${WHEELS:-}" ]]; then
  $PY -m pip install -q --no-index --find-links "$WHEELS" -e ".[dev]" || exit 1
fi
status=0
want() { [[ -z "$STEPS" || " $STEPS " == *" $1 "* ]]; }
STEPS="$*"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total --format=csv
fi
want 1 && { echo "## gpu tests"
  timeout 150 $PY -m pytest -q -m gpu -p no:cacheprovider tests/gpu || status=1; }
want 2 && { echo "## PPO step benchmark (bf16, random Qwen2 0.5B-class)"
  timeout 120 $PY -m scripts.bench gpu --steps 3 || status=1; }
want 3 && echo "## DeepSpeed ZeRO-2 on one GPU (fast_dev_run)"
if ! want 3; then
  :  # not asked for
elif [[ -f configs/trainer/deepspeed_zero2.yaml ]]; then
  timeout 90 $PY -m lit_rlhf.cli fit --config configs/ppo/countdown_tiny.yaml \
    --config configs/trainer/deepspeed_zero2.yaml --trainer.devices=1 \
    --trainer.fast_dev_run=true && echo "| ZeRO-2 | ok |" || { echo "| ZeRO-2 | FAILED |"; status=1; }
else
  echo "| ZeRO-2 | skipped: configs/trainer/deepspeed_zero2.yaml missing |"
fi
want 4 && { echo "## preset dry runs on the GPU"
  LIT_RLHF_DRY_RUN_DEVICE=gpu timeout 120 $PY -m pytest -q -rs -p no:cacheprovider \
    tests/test_preset_dry_run.py::test_preset_dry_run || status=1; }
want 5 && { echo "## packed vs padded update step (mid-llama)"
  for budget in 1024 4096; do
    timeout 30 $PY -m scripts.bench packing --repeats 2 --micro-batch-tokens $budget || status=1
  done; }
if want 6; then
  echo "## on-policy vs one-step-off (mid-llama)"
  engine=hf && $PY -c "import vllm" 2>/dev/null && engine=vllm
  timeout 120 $PY -m scripts.bench overlap --sizes mid --engine $engine --steps 3 --warmup 2 \
    --repeats 1 || status=1
fi
exit $status
