"""The training core is reusable: a second, minimal LightningModule (REINFORCE with a learned
baseline and a KL penalty to a frozen reference) written here, not in the package, composes the
shared optimizer step, the frozen-model helper and the rollout component, trains on the tiny
Countdown config, and takes a loss-term callback and a reward-term callback through the
protocols."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import yaml
from torch import nn

from lit_rlhf.algos import kl_penalty, masked_mean
from lit_rlhf.callbacks import EntropyBonus, PolicyLossContext, policy_loss_terms
from lit_rlhf.data import CountdownPrompts, PromptDataModule
from lit_rlhf.models import load_causal_lm
from lit_rlhf.models.forward import forward_response
from lit_rlhf.rewards import CountdownReward
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.training import FrozenModules, OptimizerStep, RolloutCollector, freeze
from tests.helpers import quiet_trainer

TINY = yaml.safe_load((Path(__file__).parents[2] / "configs/ppo/countdown_tiny.yaml").read_text())


class Reinforce(L.LightningModule):
    """REINFORCE: loss = -(r - b) * log pi(y|x) + (r - b)^2 + beta * KL(pi || ref), b learned."""

    def __init__(self, model: str, tokenizer, beta: float = 0.05) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model_name, self.tokenizer, self.beta = model, tokenizer, beta
        self.rollouts = RolloutCollector(HFGenerationEngine(max_new_tokens=12), CountdownReward())
        self.step_optimizer = OptimizerStep(max_grad_norm=1.0)
        self.frozen = FrozenModules("reference")
        self.baseline = nn.Parameter(torch.zeros(()))

    def configure_model(self) -> None:
        self.step_optimizer.configure(self._trainer.strategy if self._trainer else None)
        if not hasattr(self, "policy"):
            self.policy = load_causal_lm(self.model_name)
            self.reference = freeze(load_causal_lm(self.model_name))

    def configure_optimizers(self):
        return torch.optim.AdamW([*self.policy.parameters(), self.baseline], lr=1e-3)

    def training_step(self, batch, batch_idx):
        ro = self.rollouts.collect(self.policy, self.tokenizer, batch, samples_per_prompt=2,
                                   trainer=self.trainer, module=self)  # fmt: skip
        with torch.no_grad():
            ref = forward_response(self.reference, ro.input_ids, ro.attention_mask,
                                   ro.response_ids, temperature=1.0).log_probs  # fmt: skip

        def loss(rows: torch.Tensor) -> torch.Tensor:
            mask = ro.response_mask[rows]
            logits_etc = forward_response(self.policy, ro.input_ids[rows], ro.attention_mask[rows],
                                          ro.response_ids[rows], temperature=1.0)  # fmt: skip
            adv = (ro.scores[rows] - self.baseline.detach())[:, None].expand_as(mask)
            pg = -adv * logits_etc.log_probs
            ctx = PolicyLossContext(logits_etc.logits, logits_etc.log_probs,
                                    logits_etc.log_probs.detach(), adv, mask, pg)  # fmt: skip
            extra, self.term_stats = policy_loss_terms(self.trainer, self, ctx)
            kl = kl_penalty(logits_etc.log_probs, ref[rows], estimator="k3")
            value = (ro.scores[rows] - self.baseline).square().mean()
            return (masked_mean(pg + extra + self.beta * kl, mask) + value) * len(rows) / len(ro)

        stats = self.step_optimizer(self, self.optimizers(), torch.arange(len(ro)).split(4), loss)
        self.log_dict({"reward": ro.scores.mean(), **stats, **self.term_stats, **ro.term_stats})

    def on_save_checkpoint(self, checkpoint):
        self.frozen.drop(checkpoint)

    def on_load_checkpoint(self, checkpoint):
        self.frozen.restore(self, checkpoint)


class LengthPenalty(L.Callback):
    """A reward-term callback: -0.01 per response character."""

    def reward_term(self, trainer, pl_module, ctx):
        term = -0.01 * torch.tensor([float(len(r)) for r in ctx.responses])
        return term, {"mean": term.mean()}


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
