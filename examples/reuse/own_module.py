"""A LightningModule of your own on lit-rlhf's optimizer-step core: REINFORCE with a learned
baseline and a KL penalty to a frozen reference, on procedural Countdown with the random tiny
model ``builtin:tiny-llama`` (no downloads, CPU, seconds).

It composes the core's parts: ``RolloutCollector`` (generation + reward + reward-term
callbacks), ``OptimizerStep`` (micro-batch backward, gradient hooks, clipping, step, non-finite
skips), ``FrozenModules`` / ``freeze`` (a reference kept out of checkpoints), and takes a
loss-term callback (``EntropyBonus``) and a reward-term callback (``LengthPenalty`` below)
through the protocols.

Run: ``python examples/reuse/own_module.py``
"""

from __future__ import annotations

import math
import tempfile
import warnings

import lightning as L
import torch
from torch import nn

from lit_rlhf.algos import kl_penalty, masked_mean
from lit_rlhf.callbacks import EntropyBonus, PolicyLossContext, policy_loss_terms
from lit_rlhf.data import CountdownPrompts, PromptDataModule
from lit_rlhf.models import forward_response, load_causal_lm
from lit_rlhf.rewards import CountdownReward
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.training import FrozenModules, OptimizerStep, RolloutCollector, freeze

MODEL = "builtin:tiny-llama"


class Reinforce(L.LightningModule):
    """REINFORCE: loss = -(r - b) * log pi(y|x) + (r - b)^2 + beta * KL(pi || ref), b learned."""

    def __init__(self, model: str, tokenizer, beta: float = 0.05) -> None:
        super().__init__()
        self.automatic_optimization = False  # OptimizerStep takes the step
        self.model_name, self.tokenizer, self.beta = model, tokenizer, beta
        self.rollouts = RolloutCollector(HFGenerationEngine(max_new_tokens=12), CountdownReward())
        self.step_optimizer = OptimizerStep(max_grad_norm=1.0)
        self.frozen = FrozenModules("reference")
        self.baseline = nn.Parameter(torch.zeros(()))
        self.term_stats: dict[str, torch.Tensor] = {}

    def configure_model(self) -> None:
        # hands max_grad_norm to DeepSpeed when it is the strategy (a no-op otherwise)
        self.step_optimizer.configure(self._trainer.strategy if self._trainer else None)
        if not hasattr(self, "policy"):
            self.policy = load_causal_lm(self.model_name)
            self.reference = freeze(load_causal_lm(self.model_name))

    def configure_optimizers(self):
        return torch.optim.AdamW([*self.policy.parameters(), self.baseline], lr=1e-3)

    def training_step(self, batch, batch_idx):
        # trainer= and module=: the reward-term callbacks add their terms to the scores
        ro = self.rollouts.collect(self.policy, self.tokenizer, batch, samples_per_prompt=2,
                                   trainer=self.trainer, module=self)  # fmt: skip
        with torch.no_grad():
            ref = forward_response(self.reference, ro.input_ids, ro.attention_mask,
                                   ro.response_ids, temperature=1.0).log_probs  # fmt: skip

        def loss(rows: torch.Tensor) -> torch.Tensor:
            mask = ro.response_mask[rows]
            out = forward_response(self.policy, ro.input_ids[rows], ro.attention_mask[rows],
                                   ro.response_ids[rows], temperature=1.0)  # fmt: skip
            adv = (ro.scores[rows] - self.baseline.detach())[:, None].expand_as(mask)
            pg = -adv * out.log_probs
            ctx = PolicyLossContext(out.logits, out.log_probs, out.log_probs.detach(), adv,
                                    mask, pg)  # fmt: skip
            extra, self.term_stats = policy_loss_terms(self.trainer, self, ctx)  # loss terms
            kl = kl_penalty(out.log_probs, ref[rows], estimator="k3")
            value = (ro.scores[rows] - self.baseline).square().mean()
            # micro-batch losses are scaled so that their sum is the whole batch's loss
            return (masked_mean(pg + extra + self.beta * kl, mask) + value) * len(rows) / len(ro)

        stats = self.step_optimizer(self, self.optimizers(), torch.arange(len(ro)).split(4), loss)
        self.log_dict({"reward": ro.scores.mean(), **stats, **self.term_stats, **ro.term_stats})

    def on_save_checkpoint(self, checkpoint):
        self.frozen.drop(checkpoint)  # the frozen reference is not saved
        self.step_optimizer.save_to(checkpoint)  # skip counters, lr schedule

    def on_load_checkpoint(self, checkpoint):
        self.frozen.restore(self, checkpoint)  # puts the reference back: strict loading works
        self.step_optimizer.load_from(checkpoint)


class LengthPenalty(L.Callback):
    """A reward-term callback: -0.01 per response character."""

    def reward_term(self, trainer, pl_module, ctx):
        term = -0.01 * torch.tensor([float(len(r)) for r in ctx.responses])
        return term, {"mean": term.mean()}


def main() -> dict[str, float]:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    L.seed_everything(0, verbose=False)
    data = PromptDataModule(
        tokenizer=MODEL,
        train=CountdownPrompts(num_examples=16, seed=0, num_numbers=3, max_value=20),
        batch_size=4,
    )
    module = Reinforce(MODEL, data.tokenizer)
    before = {n: p.detach().clone() for n, p in load_causal_lm(MODEL).named_parameters()}
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
            callbacks=[EntropyBonus(alpha=0.01), LengthPenalty()],
        )  # fmt: skip
        trainer.fit(module, datamodule=data)
        trainer.save_checkpoint(f"{root}/reinforce.ckpt")
        saved = torch.load(f"{root}/reinforce.ckpt", weights_only=True)["state_dict"]

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert trainer.global_step == 3, trainer.global_step  # one OptimizerStep per training_step
    for key in ("train/grad_norm", "EntropyBonus/entropy", "LengthPenalty/mean", "reward"):
        assert math.isfinite(metrics[key]), (key, metrics)
    assert metrics["train/grad_norm"] > 0 and metrics["LengthPenalty/mean"] <= 0
    moved = [n for n, p in module.policy.named_parameters() if not torch.equal(p, before[n])]
    assert moved, "no policy parameter changed"
    assert float(module.baseline.detach()) != 0.0  # the learned baseline moved
    assert not any(k.startswith("reference.") for k in saved)  # the frozen copy is not saved
    return metrics


if __name__ == "__main__":
    m = main()
    print(
        f"own_module OK: 3 REINFORCE steps, train/grad_norm={m['train/grad_norm']:.3f}, "
        f"EntropyBonus/entropy={m['EntropyBonus/entropy']:.3f}, "
        f"LengthPenalty/mean={m['LengthPenalty/mean']:.3f}"
    )
