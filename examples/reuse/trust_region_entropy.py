"""The TRE loss term (``TrustRegionEntropy``) in a LightningModule of your own, through the
loss-term protocol (``PolicyLossContext`` + ``policy_loss_terms``), on plain torch tensors: a
token policy (embedding + linear head) with a REINFORCE loss (CPU, seconds).

1. The module of docs/exploration.md ("Use TRE in your own LightningModule") trains with TRE-K
   and logs its diagnostics.
2. The term acts: with zero advantages the loss is TRE alone, and the entropy inside the top-2
   region rises step after step.

Run: ``python examples/reuse/trust_region_entropy.py``
"""

from __future__ import annotations

import math
import tempfile
import warnings

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from lit_rlhf.callbacks import PolicyLossContext, TrustRegionEntropy, policy_loss_terms

VOCAB, LENGTH, ROWS = 32, 6, 64


class MyPolicy(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))

    def training_step(self, batch, batch_idx):
        logits = self.net(batch["input_ids"])  # [b, R, V]
        logp = logits.log_softmax(-1).gather(-1, batch["actions"][..., None]).squeeze(-1)
        pg = -batch["advantages"] * logp  # [b, R] per-token loss
        ctx = PolicyLossContext(logits, logp, logp.detach(), batch["advantages"], batch["mask"], pg)
        extra, stats = policy_loss_terms(self.trainer, self, ctx)  # the protocol
        self.log_dict(stats)
        return ((pg + extra) * batch["mask"]).sum() / batch["mask"].sum()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


def batches(advantage_scale: float) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    rows = [
        {
            "input_ids": torch.randint(VOCAB, (LENGTH,), generator=g),
            "actions": torch.randint(VOCAB, (LENGTH,), generator=g),
            "advantages": (advantage_scale * torch.randn((), generator=g)).expand(LENGTH).clone(),
            "mask": torch.arange(LENGTH) < torch.randint(2, LENGTH + 1, (), generator=g),
        }
        for _ in range(ROWS)
    ]
    return DataLoader(rows, batch_size=16)


class Record(L.Callback):
    """Keeps one logged metric after every training batch."""

    def __init__(self, key: str) -> None:
        self.key, self.values = key, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.values.append(float(trainer.callback_metrics[self.key]))


def fit(
    tre: TrustRegionEntropy, advantage_scale: float, epochs: int
) -> tuple[L.Trainer, list[float]]:
    record = Record("TrustRegionEntropy/tre_entropy")
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu", max_epochs=epochs, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
            callbacks=[tre, record],
        )  # fmt: skip
        trainer.fit(MyPolicy(), batches(advantage_scale))
    return trainer, record.values


def main() -> dict[str, float]:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    # 1. the authors' settings: TRE-K, K = 2, alpha 0.001
    trainer, _ = fit(TrustRegionEntropy(alpha=0.001, mode="topk", k=2), 1.0, epochs=1)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for key in ("tre_entropy", "entropy", "top1_mass", "region_size", "alpha"):
        assert math.isfinite(metrics[f"TrustRegionEntropy/{key}"]), (key, metrics)
    assert metrics["TrustRegionEntropy/region_size"] == 2.0  # K = 2 tokens per position
    assert math.isclose(metrics["TrustRegionEntropy/alpha"], 0.001, rel_tol=1e-6)
    # 2. zero advantages: the gradient is TRE's alone, which raises the top-2 entropy
    _, history = fit(TrustRegionEntropy(alpha=1.0, mode="topk", k=2), 0.0, epochs=3)
    assert history[-1] > history[0], history
    metrics["tre_entropy_first"], metrics["tre_entropy_last"] = history[0], history[-1]
    return metrics


if __name__ == "__main__":
    m = main()
    print(
        "trust_region_entropy OK: "
        f"TrustRegionEntropy/tre_entropy={m['TrustRegionEntropy/tre_entropy']:.3f}, "
        f"region_size={m['TrustRegionEntropy/region_size']:.0f}; TRE alone raised it "
        f"{m['tre_entropy_first']:.3f} -> {m['tre_entropy_last']:.3f}"
    )
