"""Lightning's overhead on the compressor's training step: per-step wall time of
``CompressorDecoderModule`` fitted by ``L.Trainer`` against a bare PyTorch loop doing the same
forward / backward / clip / AdamW step on the same batches, side by side in one process. Target
(issue): a Lightning step within 10 % of the bare step (ratio <= 1.10).

    python scripts/benchmark_compressor.py [--rounds 7 --steps 50 --warmup 5] [--threads 1]
        [--compressor builtin:tiny-llama --decoder builtin:tiny-llama]
        [--context-tokens 32 --batch-size 8 --micro-batch-size 8]

Workload: configs/compressor/tiny.yaml's model (rate 8, ae_weight 1, lm_weight 0.5, lr 1e-3,
max_grad_norm 1) on the offline text sample, float32, CPU.
- Data loading is outside both timings: the batches are collected once from
  ``PromptDataModule.train_dataloader()`` and fed to both arms. Lightning's step is
  ``on_train_batch_start`` -> ``on_train_batch_end`` (the batch is fetched before it); the bare
  step is micro-batch slicing -> ``optimizer.step()``.
- Each arm builds its own module from the same seed and takes ``--steps`` steps, the first
  ``--warmup`` dropped; rounds alternate the order (L B, B L, ...). Ratio = the median over
  rounds of (Lightning's median step / the bare median step), with its min-max.
- ``--threads`` (default 1) fixes torch's intra-op threads for both arms: one thread is the least
  noisy on a shared machine. More threads shorten the step, so Lightning's fixed per-step cost
  becomes a larger fraction (a harder test).
- Same work: same weights, batches and threads give the same loss trajectory in both arms
  (checked to ``--tolerance`` at every step; the first-step loss is printed; bitwise equal in
  practice). Lightning's arm also computes the gradient norm before clipping (``OptimizerStep``
  logs it) and logs the losses: part of its overhead, not different math.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers.utils import logging as hf_logging

from lit_rlhf.data import PromptDataModule, TextChunks
from lit_rlhf.modules import CompressorDecoderModule

SAMPLE = Path(__file__).resolve().parents[1] / "lit_rlhf" / "data" / "samples" / "text_sample.jsonl"
Batch = dict[str, Any]
Run = tuple[list[float], list[float]]  # per-step seconds, per-step loss


def collect_batches(opts: argparse.Namespace) -> tuple[Any, list[Batch]]:
    """The tokenizer and ``--steps`` batches from the data module (cycled if it runs out)."""
    chunks = TextChunks(
        path=str(SAMPLE), context_tokens=opts.context_tokens, continuation_tokens=16
    )
    data = PromptDataModule(tokenizer=opts.decoder, train=chunks, batch_size=opts.batch_size)
    data.setup("fit")
    batches: list[Batch] = []
    while len(batches) < opts.steps:
        batches += list(data.train_dataloader())
    return data.tokenizer, batches[: opts.steps]


def build_module(opts: argparse.Namespace, tokenizer: Any) -> CompressorDecoderModule:
    """The module with its networks built (no trainer), seeded so both arms start identical."""
    L.seed_everything(opts.seed, verbose=False)
    module = CompressorDecoderModule(
        compressor=opts.compressor,
        decoder=opts.decoder,
        tokenizer=tokenizer,
        num_memory_tokens=None,
        compression_rate=8,
        context_tokens=opts.context_tokens,
        lm_weight=0.5,
        lr=1e-3,
        max_grad_norm=1.0,
        micro_batch_size=opts.micro_batch_size,
    )
    module.configure_model()
    return module


class StepTimer(L.Callback):
    """Wall time and loss of every training step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.losses: list[float] = []
        self.start = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, *args: Any) -> None:
        self.seconds.append(time.perf_counter() - self.start)
        self.losses.append(float(outputs["loss"]))


def run_lightning(opts: argparse.Namespace, tokenizer: Any, batches: list[Batch]) -> Run:
    module, timer = build_module(opts, tokenizer), StepTimer()
    trainer = L.Trainer(accelerator="cpu", max_steps=len(batches), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0,
                        callbacks=[timer])  # fmt: skip
    # batch_size=None: the collected batches pass through as they are, in order
    loader: DataLoader[Batch] = DataLoader(batches, batch_size=None)  # type: ignore[arg-type]
    trainer.fit(module, train_dataloaders=loader)
    return timer.seconds, timer.losses


def run_bare(opts: argparse.Namespace, tokenizer: Any, batches: list[Batch]) -> Run:
    """The module's training step without Lightning: same micro-batches, loss scaling,
    clipping and AdamW settings as ``training_step`` + ``OptimizerStep``."""
    module = build_module(opts, tokenizer)
    assert module.compressor is not None
    params = [p for p in module.compressor.parameters() if p.requires_grad]
    hp = module.hp
    optimizer = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay)
    seconds, losses = [], []
    for batch in batches:
        start = time.perf_counter()
        rows, size = batch["input_ids"].shape[0], hp.micro_batch_size
        micro = [{k: v[i : i + size] for k, v in batch.items()} for i in range(0, rows, size)]
        totals = module._token_totals(batch)
        total = torch.zeros(())
        optimizer.zero_grad()
        for part in micro:
            loss = module._weighted(module.losses(part), totals)
            loss.backward()
            total += loss.detach()
        if hp.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, hp.max_grad_norm)
        optimizer.step()
        seconds.append(time.perf_counter() - start)
        losses.append(float(total))
    return seconds, losses


def table(runs: dict[str, list[Run]], warmup: int, target: float) -> list[str]:
    """Markdown rows: per-round medians after warm-up; the ratio per round, then its median."""
    medians = {arm: [statistics.median(r[0][warmup:]) for r in rs] for arm, rs in runs.items()}
    ratios = [a / b for a, b in zip(medians["Lightning"], medians["bare"], strict=True)]
    lines = ["| arm | median step (ms) | spread over rounds (ms) | ratio vs bare |",
             "|---|---|---|---|"]  # fmt: skip
    for arm, values in medians.items():
        ratio = (f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"
                 if arm == "Lightning" else "1.000x")  # fmt: skip
        lines.append(
            f"| {arm} | {statistics.median(values) * 1e3:.2f} | "
            f"{min(values) * 1e3:.2f}-{max(values) * 1e3:.2f} | {ratio} |"
        )
    verdict = "PASS" if statistics.median(ratios) <= target else "FAIL"
    lines += ["", f"{verdict}: Lightning / bare = {statistics.median(ratios):.3f} "
              f"(target <= {target:.2f})"]  # fmt: skip
    return lines


def same_work(runs: dict[str, list[Run]], tolerance: float) -> tuple[bool, str]:
    """Whether both arms' loss trajectories agree at every step of every round."""
    pairs = [
        (a, b)
        for lit, bare in zip(runs["Lightning"], runs["bare"], strict=True)
        for a, b in zip(lit[1], bare[1], strict=True)
    ]
    worst = max(abs(a - b) for a, b in pairs)
    first_lit, first_bare = runs["Lightning"][0][1][0], runs["bare"][0][1][0]
    ok = worst <= tolerance
    return ok, (
        f"same work: {'OK' if ok else 'MISMATCH'}: first-step loss Lightning {first_lit:.8f} "
        f"vs bare {first_bare:.8f}; max |diff| over {len(pairs)} steps = {worst:.2e} "
        f"(tolerance {tolerance:.0e})"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--compressor", default="builtin:tiny-llama")
    parser.add_argument("--decoder", default="builtin:tiny-llama")
    parser.add_argument("--context-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50, help="steps per arm per round")
    parser.add_argument("--warmup", type=int, default=5, help="first steps of a run dropped")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=1.10)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    opts = parser.parse_args(argv)
    if not 0 <= opts.warmup < opts.steps:
        parser.error(f"--warmup ({opts.warmup}) must be in [0, --steps ({opts.steps}))")
    return opts


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the table and the same-work check; 1 if the arms disagree."""
    opts = parse_args(argv)
    torch.set_num_threads(opts.threads)
    # Lightning's notes on this deliberate setup (no workers, no validation, the frozen decoder
    # in eval mode) and the weight-loading progress bars only clutter the table
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*(many workers|val_dataloader|eval mode|LeafSpec)")
    hf_logging.disable_progress_bar()
    tokenizer, batches = collect_batches(opts)
    arms = {"Lightning": run_lightning, "bare": run_bare}
    runs: dict[str, list[Run]] = {arm: [] for arm in arms}
    for r in range(opts.rounds):
        for arm in list(arms)[:: 1 if r % 2 == 0 else -1]:
            gc.collect()
            runs[arm].append(arms[arm](opts, tokenizer, batches))
    ok, check = same_work(runs, opts.tolerance)
    print(f"Compressor step, Lightning vs bare PyTorch: {opts.compressor} -> {opts.decoder}, "
          f"{opts.rounds} rounds x {opts.steps} steps (first {opts.warmup} dropped), batch "
          f"{opts.batch_size} (micro {opts.micro_batch_size}) x {opts.context_tokens} tokens, "
          f"{torch.get_num_threads()} thread(s), data loading excluded\n")  # fmt: skip
    print("\n".join([*table(runs, opts.warmup, opts.target), check]), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
