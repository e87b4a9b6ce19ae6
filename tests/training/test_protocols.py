"""The reward-term protocol, the frozen-model helper and the adaptive KL callback's protocol, each
with plain objects or a plain LightningModule written here."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lit_rlhf.callbacks import AdaptiveKL, RewardContext, reward_terms
from lit_rlhf.training import FrozenModules, RolloutCollector, freeze
from lit_rlhf.types import GenerationOutput, RewardOutput
from tests.helpers import quiet_trainer


class Trainer:  # what the protocols read of a trainer
    def __init__(self, *callbacks):
        self.callbacks = list(callbacks)


class PlusOne(L.Callback):
    def reward_term(self, trainer, pl_module, ctx):
        return torch.ones_like(ctx.scores), {"n": torch.tensor(float(len(ctx.scores)))}


class Abstains(L.Callback):
    def reward_term(self, trainer, pl_module, ctx):
        return None


class WrongShape(L.Callback):
    def reward_term(self, trainer, pl_module, ctx):
        return torch.ones(3), {}


def context(scores):
    n = len(scores)
    return RewardContext(["p"] * n, ["r"] * n, [{}] * n, ["q"] * n, ["t"] * n,
                         torch.zeros(n, dtype=torch.long), torch.tensor(scores))  # fmt: skip


def test_reward_terms_sum_and_report():
    extra, stats = reward_terms(Trainer(PlusOne(), Abstains(), PlusOne()), None, context([0.0, 1]))
    assert extra.tolist() == [2.0, 2.0]  # two PlusOne terms, the abstaining one adds nothing
    assert stats == {"PlusOne/n": torch.tensor(2.0)}
    with pytest.raises(ValueError, match=r"WrongShape.reward_term returned shape \(3,\)"):
        reward_terms(Trainer(WrongShape()), None, context([0.0, 1.0]))


class EchoEngine:
    """Returns response tokens 7, 8 for every prompt row."""

    temperature = 1.0

    def generate(self, model, input_ids, attention_mask, tokenizer, *, greedy, log_probs=True):
        ids = torch.tensor([[7, 8]]).repeat(len(input_ids), 1)
        return GenerationOutput(ids, torch.ones_like(ids, dtype=torch.bool), None)

    def sync_weights(self, model):
        pass


class Tokenizer:
    def batch_decode(self, ids, skip_special_tokens):
        return [" ".join(map(str, row.tolist())) for row in ids]


def test_the_collector_scores_with_the_reward_and_then_the_terms():
    def reward(prompts, completions, rows):
        return RewardOutput(torch.tensor([float(r["v"]) for r in rows]), {"ok": torch.ones(4)})

    batch = {
        "input_ids": torch.ones(2, 3, dtype=torch.long),
        "attention_mask": torch.ones(2, 3, dtype=torch.bool),
        "prompt": ["a", "b"],
        "query_id": ["qa", "qb"],
        "task": ["t", "t"],
        "row": [{"v": 1}, {"v": 3}],
    }
    collector = RolloutCollector(EchoEngine(), reward)
    plain = collector.collect(None, Tokenizer(), batch, samples_per_prompt=2)
    assert plain.scores.tolist() == [1.0, 1.0, 3.0, 3.0]
    assert plain.query_ids == ["qa", "qa", "qb", "qb"] and plain.group_ids.tolist() == [0, 0, 1, 1]
    assert plain.responses == ["7 8"] * 4 and plain.reward_info["ok"].tolist() == [1.0] * 4
    with_terms = collector.collect(
        None, Tokenizer(), batch, samples_per_prompt=2, trainer=Trainer(PlusOne())
    )
    assert with_terms.scores.tolist() == [2.0, 2.0, 4.0, 4.0]
    assert with_terms.term_stats == {"PlusOne/n": torch.tensor(4.0)}
    with pytest.raises(ValueError, match=r"shape \(3,\) for 4 completions"):
        RolloutCollector(EchoEngine(), lambda p, c, r: RewardOutput(torch.ones(3))).collect(
            None, Tokenizer(), batch, samples_per_prompt=2
        )


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.trained = nn.Linear(2, 2)
        self.frozen = freeze(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)))
        self.absent = None


def test_frozen_modules_are_dropped_on_save_and_put_back_on_load():
    holder = Holder()
    assert not holder.frozen.training and not any(
        p.requires_grad for p in holder.frozen.parameters()
    )
    helper = FrozenModules("frozen", "absent")
    checkpoint = {"state_dict": holder.state_dict()}
    helper.drop(checkpoint)
    assert sorted(checkpoint["state_dict"]) == ["trained.bias", "trained.weight"]
    fresh = Holder()
    helper.restore(fresh, checkpoint)
    fresh.load_state_dict(checkpoint["state_dict"], strict=True)
    assert torch.equal(fresh.trained.weight, holder.trained.weight)
    with pytest.raises(ValueError, match="at least one attribute"):
        FrozenModules()


class MeasuresKL(L.LightningModule):
    """Any module that keeps `kl_coef` and returns `kl` and `num_sequences`."""

    def __init__(self, kl: float, kl_coef: float = 0.1):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.kl, self.kl_coef, self.seen = kl, kl_coef, []

    def training_step(self, batch, batch_idx):
        self.seen.append(self.kl_coef)
        return {"loss": self.w.sum() * 0, "kl": torch.tensor(self.kl), "num_sequences": 100}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_adaptive_kl_drives_any_module_with_the_protocol(tmp_path):
    module = MeasuresKL(kl=12.0)
    callback = AdaptiveKL(init_kl_coef=0.2, target=6.0, horizon=1000)
    quiet_trainer(tmp_path, max_steps=3, callbacks=[callback]).fit(
        module, DataLoader(torch.zeros(3, 1))
    )
    # KL twice the target: error clipped to 0.2, coefficient x (1 + 0.2 x 100 / 1000) per step
    assert module.seen == pytest.approx([0.2, 0.2 * 1.02, 0.2 * 1.02**2])
    assert module.kl_coef == pytest.approx(0.2 * 1.02**3)


def test_adaptive_kl_refuses_a_module_without_a_positive_coefficient(tmp_path):
    with pytest.raises(ValueError, match=r"kl\.coef > 0"):
        quiet_trainer(tmp_path, max_steps=1, callbacks=[AdaptiveKL()]).fit(
            MeasuresKL(kl=1.0, kl_coef=0.0), DataLoader(torch.zeros(1, 1))
        )
