"""A few optimizer steps of CompressorDecoderModule on the tiny models, for the DDP equality test.
The test runs it in a subprocess from the repository root (Lightning's ddp launcher re-runs this
command line once per extra process):

    python -m tests.distributed.run_compressor single|ddp STEPS OUT

``single``: one process, 8 contexts per step in 2 micro-batches of 4. ``ddp``: Lightning DDP on
2 CPU processes (gloo), 4 contexts per rank and step. Lightning always shuffles DDP's training
data: a DistributedSampler that draws ``torch.randperm`` from a generator seeded by the global
seed + epoch, rows ``perm[0::2]`` to rank 0 and ``perm[1::2]`` to rank 1. PromptDataModule's
shuffling sampler draws the same permutation from the same seed, so the single process walks it
in steps of 8 and each step the two ranks together hold the single process's batch (the DDP run
leaves PromptDataModule's shuffling off: Lightning would shuffle its output once more).
Every context has 16 tokens and the loss is autoencoding only, a token
mean over 4 * 17 tokens per rank (16 + EOS): the average of the two ranks' gradients (DDP) is
the token mean over the 8 * 17 tokens of the single process. (The continuation loss is left
out: a continuation cut short by the end of its document would give the ranks different token
counts, and the per-rank means would no longer average to the global one.)

Writes OUT.init.pt (the starting trainable weights, single only) and OUT.rank<r>.pt (the final
trainable weights of the compressor on each rank).
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

from lit_rlhf.data import PromptDataModule, TextChunks
from lit_rlhf.modules import CompressorDecoderModule
from lit_rlhf.strategies import shutdown_distributed

SAMPLE = Path(__file__).parents[2] / "lit_rlhf" / "data" / "samples" / "text_sample.jsonl"
GLOBAL_BATCH = 8
SEED = 0


def trainable(module: CompressorDecoderModule) -> dict[str, torch.Tensor]:
    assert module.compressor is not None
    return {
        n: p.detach().clone() for n, p in module.compressor.named_parameters() if p.requires_grad
    }


def main(mode: str, steps: int, out: Path) -> None:
    devices = 1 if mode == "single" else 2
    chunks = TextChunks(path=str(SAMPLE), context_tokens=16, max_chunks=64, seed=0)
    data = PromptDataModule(tokenizer="builtin:tiny-llama", train=chunks, shuffle=devices == 1,
                            seed=SEED, batch_size=GLOBAL_BATCH // devices)  # fmt: skip
    L.seed_everything(SEED)  # also DDP's sampler seed
    module = CompressorDecoderModule(tokenizer=data.tokenizer, num_memory_tokens=4, lm_weight=0.0,
                                     optim={"lr": 1e-3, "micro_batch_size": 4})  # fmt: skip
    if mode == "single":
        module.configure_model()
        torch.save(trainable(module), out.with_suffix(".init.pt"))
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
        max_steps=steps, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    try:
        trainer.fit(module, datamodule=data)
    finally:
        shutdown_distributed()
    torch.save(trainable(module), out.with_suffix(f".rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
