#!/usr/bin/env bash
# The first thing to run whenever a GPU is lent: one command of at most 8 min on one H200 with no
# network and no vLLM (image: torch 2.11, transformers 5.17, pytorch-lightning 2.6.6, accelerate,
# peft). Every other package travels as wheels in $WHEELS (default dist/wheels, git-ignored: carry
# it), 7.2 MB: jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.15.0 datasets==5.2.0
# dill==0.4.1 multiprocess==0.70.19 torchdata==0.11.0 math-verify==0.9.0 latex2sympy2_extended==
# 1.11.0 antlr4-python3-runtime==4.13.2 hjson==3.1.0 pydantic==2.14.4 pydantic_core==2.50.5
# annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 (`pip download
# --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d
# dist/wheels NAME==VERSION ...`) and deepspeed==0.19.8 built here (2.1 MB; `DS_BUILD_OPS=0 pip
# wheel deepspeed==0.19.8 --no-deps -w dist/wheels`). datasets 5.2 needs pyarrow >= 24: step 1
# prints the image's. Steps (timeouts: 40 + 4 x 60 + 120 + 80 = 480 s):
#   1. the wheels installed (--no-index, into /tmp/site), the GPU's name and memory;
#   2. `python -m lit_rlhf.measure` on this window's presets (WINDOW=1..3, below; a preset's
#      update on synthetic full-length rollouts and random weights, no generation): one JSON each
#      in ${OUT:-runs/gpu_check} with the plan's prediction vs the measured peak memory
#      (torch.cuda.max_memory_allocated), step time, tokens/s and MFU. Unmeasured, as each JSON
#      says: vLLM's memory (weights, KV cache, sleep mode) and its sampling dtype, reward models'
#      forwards, and sharding (one GPU: ZeRO states unsharded; 7B / 8B presets cut to fewer layers);
#   3. the `gpu`-marked tests (PPO; the judges incl. ReflectRM, the Bradley-Terry RM, LoRA; FSDP2
#      on one GPU: NCCL, bf16-mixed, a DCP checkpoint resumed and exported);
#   4. the preset dry runs on the GPU (tests/test_preset_dry_run.py with
#      LIT_RLHF_DRY_RUN_DEVICE=gpu: every GPU preset, one step, its DeepSpeed fragment, bf16).
# Rotation: window 1 on the first GPU, 2 on the next, 3 on the third, then 1 again (WINDOW=1..3).
# Not measured here: the compressor, SFT and reward-model presets (no RL update).
# Usage: WINDOW=1 bash scripts/gpu_check.sh [STEP ...]   (no step: all of them)
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PYTHON:-python3} WHEELS=${WHEELS:-dist/wheels} DIR=${OUT:-runs/gpu_check}
STEPS="$*" status=0
want() { [[ -z "$STEPS" || " $STEPS " == *" $1 "* ]]; }
P=configs/ppo G=configs/grm Z2=configs/trainer/deepspeed_zero2.yaml
Z3=configs/trainer/deepspeed_zero3.yaml
case ${WINDOW:-1} in  # name|configs|options, 4 presets of at most 60 s each per window
  1) PRESETS=("countdown_tre|$P/countdown_tre.yaml|" "math_tre|$P/math_tre.yaml|"
       "mgs_7b|$P/multidomain_mgs_qwen2.5-7b.yaml,$Z2|--layers 6 --max-response 2048"
       "countdown|$P/countdown_qwen2.5-1.5b.yaml|") ;;
  2) PRESETS=("hh_tre|$P/hh_tre_ultrafeedback.yaml|" "math|$P/math_qwen2.5-1.5b.yaml|"
       "consistrm_8b|$G/consistrm_qwen3-8b.yaml,$Z3|--layers 6"
       "math_dapo|$P/math_dapo_qwen2.5-1.5b.yaml|") ;;
  *) PRESETS=("math_gspo|$P/math_gspo_qwen2.5-1.5b.yaml|"
       "rft_8b|$G/rft_qwen3-8b.yaml,$Z3|--layers 6"
       "calculator|$P/countdown_calculator_qwen2.5-1.5b.yaml|"
       "reflectrm_4b|$G/reflectrm_qwen3-4b.yaml,$Z3|--layers 8") ;;
esac
mkdir -p /tmp/site "$DIR"
if want 1; then
  timeout 40 $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "$WHEELS"/*.whl || status=1
  $PY -m pip show pyarrow fsspec 2>/dev/null | grep -E "^(Name|Version)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
want 2 && for preset in "${PRESETS[@]}"; do
  IFS='|' read -r name configs options <<<"$preset"
  echo "## measure $name (window ${WINDOW:-1})"
  timeout 60 $PY -m lit_rlhf.measure --config ${configs//,/ --config } $options \
    --out "$DIR/measure_$name.json" || status=1
done
want 3 && { echo "## gpu tests"
  timeout 120 $PY -m pytest -q -m gpu -p no:cacheprovider tests/gpu || status=1; }
want 4 && { echo "## preset dry runs on the GPU"
  LIT_RLHF_DRY_RUN_DEVICE=gpu timeout 80 $PY -m pytest -q -rs -p no:cacheprovider \
    tests/test_preset_dry_run.py::test_preset_dry_run || status=1; }
exit $status
