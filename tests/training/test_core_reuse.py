"""The training core is reusable: a second, minimal LightningModule (REINFORCE with a learned
baseline and a KL penalty to a frozen reference; examples/reuse/own_module.py) composes the
shared optimizer step, the frozen-model helper and the rollout component, trains on the tiny
Countdown config, and takes a loss-term callback and a reward-term callback through the
protocols."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import yaml

from lit_rlhf.callbacks import EntropyBonus
from lit_rlhf.data import CountdownPrompts, PromptDataModule
from lit_rlhf.models import load_causal_lm
from tests.helpers import quiet_trainer

TINY = yaml.safe_load((Path(__file__).parents[2] / "configs/ppo/countdown_tiny.yaml").read_text())


# the module and the reward-term callback are the reuse example's (docs/reuse.md), tested here on
# the tiny Countdown config with a loss-term callback as well
_spec = importlib.util.spec_from_file_location(
    "own_module", Path(__file__).parents[2] / "examples" / "reuse" / "own_module.py"
)
assert _spec is not None and _spec.loader is not None
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
Reinforce, LengthPenalty = _example.Reinforce, _example.LengthPenalty


def tiny_data() -> PromptDataModule:
    data = TINY["data"]["init_args"]
    return PromptDataModule(
        tokenizer=data["tokenizer"],
        train=CountdownPrompts(**data["train"]["init_args"]),
        batch_size=data["batch_size"],
    )


def test_a_second_module_composes_the_core(tmp_path):
    torch.manual_seed(0)
    data = tiny_data()
    module = Reinforce(TINY["model"]["init_args"]["model"], data.tokenizer)
    bonus = EntropyBonus(alpha=0.01)
    trainer = quiet_trainer(tmp_path, limit_train_batches=4, callbacks=[bonus, LengthPenalty()])
    before = dict(load_causal_lm(module.model_name).named_parameters())  # what fit starts from
    trainer.fit(module, datamodule=data)

    unchanged = [n for n, p in module.policy.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, unchanged  # every policy parameter trained (step + clipping worked)
    assert float(module.baseline) != 0.0  # the learned baseline moved
    assert trainer.global_step == 4  # one OptimizerStep per training_step
    metrics = trainer.callback_metrics
    assert "train/grad_norm" in metrics and float(metrics["train/grad_norm"]) > 0
    assert float(metrics["EntropyBonus/entropy"]) > 0  # the loss-term callback took part
    assert float(metrics["LengthPenalty/mean"]) < 0  # the reward-term callback took part
    assert not any(p.requires_grad for p in module.reference.parameters())

    ckpt = tmp_path / "reinforce.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    assert any(k.startswith("policy.") for k in saved)
    assert not any(k.startswith("reference.") for k in saved)  # the frozen copy is not saved
    fresh = Reinforce(module.model_name, data.tokenizer)
    fresh.configure_model()
    fresh.on_load_checkpoint({"state_dict": saved})  # puts the reference back: strict load works
    fresh.load_state_dict(saved, strict=True)
    for name, value in module.policy.state_dict().items():
        assert torch.equal(fresh.policy.state_dict()[name], value), name
