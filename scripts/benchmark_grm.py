"""Where the time of a ConsistRM judge-training step goes: generation, critique embedding, and the
rest (scoring, advantages, the GRPO update), measured side by side in one run.

    python scripts/benchmark_grm.py                              # SmolLM2-135M + MiniLM, 8 steps
    python scripts/benchmark_grm.py --model builtin:tiny-llama --embedder builtin:tiny-llama

The judge writes critiques (template ``consistrm-v1-short``, chat template on) so the critique
embedding has real text to embed; each step = ``--pairs`` pairs x ``--samples`` rollouts of up
to ``--new-tokens`` tokens, under ``--precision`` (default ``auto``: bf16 autocast on a CPU with
native bf16, else float32; see ``lit_rlhf.training.resolve_precision``). Medians over the steps
after ``--warmup``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import lightning as L
import torch


class TimedEngine:
    """Wraps an engine and adds up the seconds spent in ``generate``."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.seconds = engine, 0.0
        self.temperature = engine.temperature

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.engine.generate(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def sync_weights(self, model: Any) -> None:
        self.engine.sync_weights(model)


class StepTimer(L.Callback):
    def __init__(self, engine: TimedEngine) -> None:
        self.engine = engine
        self.rows: list[dict[str, float]] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self.start, self.gen = time.perf_counter(), self.engine.seconds

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, out: Any, batch: Any, i: int
    ) -> None:
        embed = float(trainer.callback_metrics["CritiqueConsistencyReward/embed_seconds"])
        step = time.perf_counter() - self.start
        self.rows.append(
            {"step": step, "generation": self.engine.seconds - self.gen, "embedding": embed}
        )


def trainer_precision(precision: str) -> Any:
    """The CPU trainer's precision: ``auto`` resolved for this CPU (bf16 autocast is several
    times slower than float32 where the CPU has no native bf16), an explicit value as given."""
    from lit_rlhf.training import resolve_precision

    return resolve_precision(precision, "cpu")  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--embedder", default="builtin:all-minilm-l6-v2")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--precision", default="auto", help="auto (fits this CPU), 32-true, bf16-mixed, ..."
    )
    opts = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(opts.threads)
    from lit_rlhf.callbacks import ConsistencyAnswerReward, CritiqueConsistencyReward
    from lit_rlhf.data import PromptDataModule, SyntheticPairs
    from lit_rlhf.modules import GenerativeRewardModule
    from lit_rlhf.rollout import HFGenerationEngine

    engine = TimedEngine(HFGenerationEngine(max_new_tokens=opts.new_tokens))
    module = GenerativeRewardModule(
        mode="consistrm",
        model=opts.model,
        engine=engine,
        samples_per_prompt=opts.samples,
        micro_batch_size=16,
        lr=1e-5,
    )
    pairs = SyntheticPairs(num_examples=opts.pairs * (opts.steps + opts.warmup), seed=0)
    data = PromptDataModule(
        tokenizer=opts.model, train=pairs, batch_size=opts.pairs, max_prompt_length=1024
    )
    timer = StepTimer(engine)
    callbacks = [ConsistencyAnswerReward(), CritiqueConsistencyReward(opts.embedder), timer]
    L.Trainer(
        accelerator="cpu",
        precision=trainer_precision(opts.precision),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    ).fit(module, datamodule=data)
    rows = timer.rows[opts.warmup :]
    med = {k: statistics.median(r[k] for r in rows) for k in ("step", "generation", "embedding")}
    rest = med["step"] - med["generation"] - med["embedding"]
    print(
        f"{opts.model}, {opts.pairs} pairs x {opts.samples} rollouts, up to {opts.new_tokens} "
        f"new tokens, embedder {opts.embedder}; medians of {len(rows)} steps\n"
    )
    print("| part | seconds | share of the step |\n|---|---|---|")
    for name, value in (
        ("generation", med["generation"]),
        ("critique embedding", med["embedding"]),
        ("scoring + GRPO update", rest),
    ):
        print(f"| {name} | {value:.3f} | {value / med['step']:.1%} |")
    print(f"| whole step | {med['step']:.3f} | 100% |")


if __name__ == "__main__":
    main()
