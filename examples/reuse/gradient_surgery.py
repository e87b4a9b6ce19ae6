"""Modular gradient surgery (``ModularGradientSurgery``, MGS) in a LightningModule of your own:
the random tiny model ``builtin:tiny-llama`` learns two "domains" of text at once (next-token
loss), and the callback combines the two domains' gradients per attention / MLP module with
PCGrad before every optimizer step (no downloads, CPU, seconds).

What the module must do (the callback refuses a module with automatic optimisation at setup):
manual optimisation, ``OptimizerStep(max_grad_norm=...)`` as the step, ``task_of=`` naming each
micro-batch's domain (one domain per micro-batch), and one ``self.log_dict(stats)`` of what the
step returns (the surgery's diagnostics, the gradient norm, the lr and the skip counter).

Run: ``python examples/reuse/gradient_surgery.py``
"""

from __future__ import annotations

import math
import tempfile
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_rlhf.callbacks import ModularGradientSurgery
from lit_rlhf.models import load_causal_lm, load_tokenizer
from lit_rlhf.training import OptimizerStep

MODEL = "builtin:tiny-llama"
TEXTS = {  # two domains whose next-token targets disagree
    "arithmetic": ["one plus one is two", "two plus two is four", "three plus one is four"],
    "poetry": ["the moon is a silver boat", "the sea is a sleeping cat", "one is the moon"],
}


class TwoDomainLM(L.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.automatic_optimization = False  # 1. manual optimisation
        self.lr = lr
        self.tokenizer = load_tokenizer(MODEL)
        self.model = load_causal_lm(MODEL)
        # 2. the core's step; clipping is ITS max_grad_norm (after the surgery). Lightning's
        # Trainer(gradient_clip_val=...) is not applied under manual optimisation.
        self.step_fn = OptimizerStep(max_grad_norm=1.0)

    def configure_model(self) -> None:
        self.step_fn.configure(self.trainer.strategy)  # clipping handed to DeepSpeed there

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr)

    def training_step(self, rows, batch_idx):
        # one micro-batch per domain: (domain, token ids, attention mask)
        micro = []
        for task in sorted({r["task"] for r in rows}):
            texts = [r["text"] for r in rows if r["task"] == task]
            enc = self.tokenizer(texts, return_tensors="pt", padding=True)
            micro.append((task, enc["input_ids"], enc["attention_mask"]))
        n = len(rows)

        def loss(m):
            _, ids, mask = m
            labels = ids.masked_fill(mask == 0, -100)
            out = self.model(input_ids=ids, attention_mask=mask, labels=labels)
            return out.loss * len(ids) / n  # micro-batch losses sum to the batch's loss

        # 3. task_of names each micro-batch's domain: with the callback present the backward
        # runs domain by domain and the callback combines the per-domain gradients
        stats = self.step_fn(self, self.optimizers(), micro, loss, task_of=lambda m: m[0])
        # 4. one log line: ModularGradientSurgery/*, train/grad_norm, train/lr,
        # fault/skipped_steps (the callback logs nothing itself, so nothing is logged twice)
        self.log_dict(stats, batch_size=n)


def main() -> dict[str, float]:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    L.seed_everything(0, verbose=False)
    rows = [{"task": t, "text": s} for t, texts in TEXTS.items() for s in texts]
    loader = DataLoader(rows, batch_size=len(rows), shuffle=True, collate_fn=list)
    surgery = ModularGradientSurgery(granularity="module", diagnostics=["global"])
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu", max_steps=4, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
            callbacks=[surgery],
        )  # fmt: skip
        trainer.fit(TwoDomainLM(), loader)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert trainer.global_step == 4, trainer.global_step
    assert metrics["ModularGradientSurgery/domains"] == 2.0, metrics
    for key in (
        "ModularGradientSurgery/cosine_mean",
        "ModularGradientSurgery/conflict_fraction",
        "ModularGradientSurgery/removed_share",
        "ModularGradientSurgery/global/cosine_mean",
        "train/grad_norm",
    ):
        assert math.isfinite(metrics[key]), (key, metrics)
    return metrics


if __name__ == "__main__":
    m = main()
    print(
        "gradient_surgery OK: 4 steps over 2 domains, "
        f"cosine_mean={m['ModularGradientSurgery/cosine_mean']:.3f}, "
        f"conflict_fraction={m['ModularGradientSurgery/conflict_fraction']:.3f}, "
        f"removed_share={m['ModularGradientSurgery/removed_share']:.3f}, "
        f"train/grad_norm={m['train/grad_norm']:.3f}"
    )
