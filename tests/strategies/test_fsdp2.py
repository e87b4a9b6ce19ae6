"""FSDP2Strategy's fixed mesh sizes and the sharding helper's choice of units, on one process
(the sharded runs themselves: tests/distributed/test_fsdp2_distributed.py)."""

from __future__ import annotations

import pytest
from lightning.pytorch.strategies import DDPStrategy

from lit_rlhf.models import CriticModel, load_causal_lm
from lit_rlhf.strategies import FSDP2Strategy, is_fsdp2
from lit_rlhf.training.sharding import decoder_blocks, shard_networks


@pytest.mark.parametrize("name", ["data_parallel_size", "tensor_parallel_size"])
def test_mesh_sizes_are_refused(name):
    with pytest.raises(ValueError, match=f"sets {name} itself.*Fix: remove it"):
        FSDP2Strategy(**{name: 2})


def test_the_strategy_is_fsdp2_and_ddp_is_not():
    assert is_fsdp2(FSDP2Strategy()) and not is_fsdp2(DDPStrategy()) and not is_fsdp2(None)


def test_decoder_blocks_of_a_policy_and_a_critic(tiny_model_dir):
    policy = load_causal_lm(str(tiny_model_dir))
    layers = list(policy.model.layers)
    assert layers and [id(b) for b in decoder_blocks(policy)] == [id(b) for b in layers]
    critic = CriticModel.from_pretrained(str(tiny_model_dir))
    assert [type(b).__name__ for b in decoder_blocks(critic)] == [type(layers[0]).__name__] * len(
        layers
    )


def test_nothing_is_sharded_outside_fsdp2(tiny_model_dir):
    policy = load_causal_lm(str(tiny_model_dir))
    before = [type(m) for m in policy.modules()]
    shard_networks(DDPStrategy(), policy, None)
    assert [type(m) for m in policy.modules()] == before
