"""CPUDeepSpeedStrategy and the DeepSpeed hooks of lit_rlhf.strategies, in the default (fast) run.

Multi-process runs, and the checks that DeepSpeed training matches a single process, are in
tests/distributed (``pytest -m distributed``).
"""

from __future__ import annotations

import pytest
from lightning.pytorch.strategies import DDPStrategy
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

from lit_rlhf.strategies import (
    CPUDeepSpeedStrategy,
    set_deepspeed_gradient_clipping,
    transformers_zero3_context,
)
from tests.distributed.launch import fit_with_fragment


def test_one_process_zero2_from_yaml(tiny_model_dir, tmp_path):
    # the YAML fragment's class_path, on 1 CPU process: DeepSpeed init, its ZeRO-2 optimizer,
    # rollout with HF generate, PPO update and validation (about 10 s on an idle 2-core machine)
    output = fit_with_fragment("cpu_deepspeed_zero2", tmp_path, "--trainer.devices=1")
    assert "initializing deepspeed distributed: GLOBAL_RANK: 0, MEMBER: 1/1" in output


def test_gradient_clipping_goes_into_the_deepspeed_config():
    strategy = CPUDeepSpeedStrategy(stage=2)
    set_deepspeed_gradient_clipping(strategy, 0.5)
    assert strategy.config["gradient_clipping"] == 0.5
    set_deepspeed_gradient_clipping(strategy, 0.5)  # idempotent (configure_model may rerun)
    with pytest.raises(ValueError, match="set only one of them"):
        set_deepspeed_gradient_clipping(strategy, 1.0)
    unclipped = CPUDeepSpeedStrategy(stage=2)
    set_deepspeed_gradient_clipping(unclipped, None)
    assert unclipped.config["gradient_clipping"] == 0.0


def test_gradient_clipping_leaves_other_strategies_alone():
    set_deepspeed_gradient_clipping(DDPStrategy(), 1.0)
    set_deepspeed_gradient_clipping(None, 1.0)


@pytest.mark.parametrize("stage", [2, 3])
def test_transformers_sees_zero3_only_inside_the_context(stage):
    strategy = CPUDeepSpeedStrategy(stage=stage)
    with transformers_zero3_context(strategy):
        assert is_deepspeed_zero3_enabled() == (stage == 3)
    assert not is_deepspeed_zero3_enabled()
