"""The exploration callbacks reach a plain LightningModule's loss through the loss-term protocol,
and their schedules survive a resume."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lit_rlhf.algos import masked_mean, trust_region_entropy
from lit_rlhf.callbacks import (
    EntropyBonus,
    ForkingTokens,
    KLCov,
    PolicyLossContext,
    TrustRegionEntropy,
    policy_loss_terms,
)
from tests.helpers import quiet_trainer

VOCAB, LENGTH = 32, 6


class PlainPolicy(L.LightningModule):
    """Not one of ours: a bag-of-embeddings "policy" trained with REINFORCE on fixed tokens. It
    adopts the protocol in the two marked lines."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))
        self.last_loss: torch.Tensor | None = None
        self.last_stats: dict[str, torch.Tensor] = {}

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        inputs, actions, advantages = batch[:, 0], batch[:, 1], batch[:, 2].float() - 1.0
        logits = self.net(inputs)  # [b, R, V]
        log_probs = torch.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1)
        mask = torch.ones_like(log_probs, dtype=torch.bool)
        pg = -advantages * log_probs
        ctx = PolicyLossContext(logits, log_probs, log_probs.detach(), advantages, mask, pg)
        extra, self.last_stats = policy_loss_terms(self.trainer, self, ctx)  # protocol, line 1
        loss = masked_mean(pg + extra, mask)  # protocol, line 2
        self.last_loss = loss.detach()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    data = torch.stack(
        [
            torch.randint(0, VOCAB, (n, LENGTH), generator=g),
            torch.randint(0, VOCAB, (n, LENGTH), generator=g),
            torch.randint(0, 3, (n, LENGTH), generator=g),
        ],
        dim=1,
    )
    return DataLoader(data, batch_size=4)


def _trainer(tmp_path, callbacks, **kwargs) -> L.Trainer:
    return quiet_trainer(tmp_path, callbacks=callbacks, enable_checkpointing=True, **kwargs)


def test_tre_term_enters_a_plain_modules_loss(tmp_path):
    plain, with_tre = PlainPolicy(), PlainPolicy()
    batch = next(iter(_loader()))
    _trainer(tmp_path, [], fast_dev_run=True).fit(plain, _loader())  # one batch: ``batch``
    tre = TrustRegionEntropy(alpha=0.5, mode="topk", k=2)
    _trainer(tmp_path, [tre], fast_dev_run=True).fit(with_tre, _loader())
    # expected: same REINFORCE loss minus alpha * mean scaled trust-region entropy
    with torch.no_grad():
        h, _ = trust_region_entropy(PlainPolicy().net(batch[:, 0]), mode="topk", k=2)
    assert with_tre.last_loss == pytest.approx(float(plain.last_loss - 0.5 * h.mean()), rel=1e-5)
    assert "TrustRegionEntropy/tre_entropy" in with_tre.last_stats
    assert with_tre.last_stats["TrustRegionEntropy/region_size"] == pytest.approx(2.0)
    changed = any(
        not torch.allclose(a, b)
        for a, b in zip(plain.parameters(), with_tre.parameters(), strict=True)
    )
    assert changed  # the bonus changed the update


@pytest.mark.parametrize(
    "callback",
    [
        EntropyBonus(alpha=0.1),
        TrustRegionEntropy(mode="topp", p=0.9),
        ForkingTokens(),
        KLCov(top_fraction=0.1),
    ],
    ids=lambda c: type(c).__name__,
)
def test_each_callback_trains_a_plain_module(tmp_path, callback):
    module = PlainPolicy()
    _trainer(tmp_path, [callback]).fit(module, _loader())
    assert module.last_loss is not None and torch.isfinite(module.last_loss)
    assert any(k.startswith(type(callback).__name__ + "/") for k in module.last_stats)
    assert callback.coefficient.steps == 2  # one per optimizer step


def test_forking_tokens_zero_the_loss_of_low_entropy_tokens():
    logits = torch.zeros(1, 5, 4)
    logits[0, :, 0] = torch.tensor([0.0, 5.0, 5.0, 5.0, 5.0])  # position 0: uniform, max entropy
    pg = torch.ones(1, 5)
    mask = torch.ones(1, 5, dtype=torch.bool)
    ctx = PolicyLossContext(logits, torch.zeros(1, 5), torch.zeros(1, 5), pg, mask, pg)
    term, stats = ForkingTokens(top_fraction=0.2).policy_loss_term(None, None, ctx)
    assert (pg + term).tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]  # ceil(0.2 * 5) = 1 kept
    assert stats["kept_fraction"] == pytest.approx(0.2)


def test_full_vocab_diagnostics_are_computed_once_and_shared(monkeypatch):
    import lit_rlhf.training.protocols as loss_terms

    calls = []
    real = loss_terms.entropy_and_top1
    monkeypatch.setattr(loss_terms, "entropy_and_top1", lambda z: calls.append(1) or real(z))
    logits = torch.randn(2, 5, 9, requires_grad=True)
    mask = torch.ones(2, 5, dtype=torch.bool)
    zeros = torch.zeros(2, 5)
    ctx = PolicyLossContext(logits, zeros, zeros, zeros, mask, zeros)
    tre_stats = TrustRegionEntropy().policy_loss_term(None, None, ctx)[1]
    bonus_stats = EntropyBonus().policy_loss_term(None, None, ctx)[1]
    forking_stats = ForkingTokens().policy_loss_term(None, None, ctx)[1]
    assert len(calls) == 1
    expected = torch.distributions.Categorical(logits=logits.detach()).entropy().mean()
    for stats in (tre_stats, bonus_stats, forking_stats):
        torch.testing.assert_close(stats["entropy"], expected)
    torch.testing.assert_close(
        tre_stats["top1_mass"], torch.softmax(logits.detach(), -1).max(-1).values.mean()
    )


def test_kl_cov_replaces_clipping_with_unclipped_ratio_loss():
    log_probs = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-0.5, -1.0]])
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    clipped = torch.tensor([[-1.2, 1.0]])  # what a clipped PPO loss would give here
    ctx = PolicyLossContext(torch.zeros(1, 2, 3), log_probs, old, adv, mask, clipped)
    term, _ = KLCov(top_fraction=0.5, coef=1.0).policy_loss_term(None, None, ctx)
    total = clipped + term
    # unclipped loss -A * exp(logp - old) = [-exp(0.5), exp(0)];
    # covariance (A - 0) * (logp - (-0.5)) = [0.5, 0.5], a tie broken by position: index 0 is
    # selected (ceil(0.5 * 2) = 1 token) and gets |0 - (-0.5)| = 0.5 added
    expected = torch.tensor([[-(torch.e**0.5) + 0.5, 1.0]])
    torch.testing.assert_close(total.detach(), expected)


def test_schedule_state_survives_resume(tmp_path):
    def make() -> TrustRegionEntropy:
        return TrustRegionEntropy(
            alpha=1.0, schedule="linear", final_alpha=0.0, total_steps=4, log_full_entropy=False
        )

    first = make()
    t1 = _trainer(tmp_path, [first])
    t1.fit(PlainPolicy(), _loader())
    assert first.coefficient.steps == 2 and first.coefficient() == pytest.approx(0.5)
    ckpt = tmp_path / "tre.ckpt"
    t1.save_checkpoint(ckpt)
    resumed = make()
    t2 = _trainer(tmp_path, [resumed], max_epochs=2)
    t2.fit(PlainPolicy(), _loader(), ckpt_path=ckpt)
    uninterrupted = make()
    _trainer(tmp_path, [uninterrupted], max_epochs=2).fit(PlainPolicy(), _loader())
    assert resumed.coefficient.steps == uninterrupted.coefficient.steps == 4
    assert resumed.coefficient() == uninterrupted.coefficient() == pytest.approx(0.0)


def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError):
        TrustRegionEntropy(mode="topp", p=1.5)
    with pytest.raises(ValueError):
        ForkingTokens(top_fraction=0.0)
    with pytest.raises(ValueError):
        EntropyBonus(schedule="linear")  # needs final_alpha and total_steps
