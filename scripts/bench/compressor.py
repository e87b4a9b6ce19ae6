"""Lightning's overhead on the compressor's training step: ``CompressorDecoderModule`` under
``L.Trainer`` against a bare PyTorch loop on the same batches (target: ratio <= 1.10; exit 1 when
the two arms' losses differ by more than ``--tolerance``).

    python -m scripts.bench compressor [--rounds 7 --steps 50 --warmup 5] [--threads 1]

Workload, timing and figures: docs/compressor.md, "Lightning's overhead".
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import time
import warnings
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from scripts.bench.runner import SAMPLES, Report, StepTimer, fit, int_args, order, ratio

Run = tuple[list[float], list[float]]  # per-step seconds, per-step loss
SMOKE = {"rounds": 1, "steps": 3, "warmup": 1}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(threads=1)
    parser.add_argument("--compressor", default="builtin:tiny-llama")
    parser.add_argument("--decoder", default="builtin:tiny-llama")
    int_args(parser, context_tokens=32, batch_size=8, micro_batch_size=8, steps=50, warmup=5,
             rounds=7, seed=0)  # fmt: skip
    parser.add_argument("--target", type=float, default=1.10)
    parser.add_argument("--tolerance", type=float, default=1e-5)


def collect_batches(opts: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]]:
    from lit_rlhf.data import PromptDataModule, TextChunks

    chunks = TextChunks(path=str(SAMPLES / "text_sample.jsonl"),
                        context_tokens=opts.context_tokens, continuation_tokens=16)  # fmt: skip
    data = PromptDataModule(tokenizer=opts.decoder, train=chunks, batch_size=opts.batch_size)
    data.setup("fit")
    batches: list[dict[str, Any]] = []
    while len(batches) < opts.steps:
        batches += list(data.train_dataloader())
    return data.tokenizer, batches[: opts.steps]


def build_module(opts: argparse.Namespace, tokenizer: Any) -> Any:
    """The module with its networks built, seeded so both arms start identical."""
    from lit_rlhf.modules import CompressorDecoderModule

    L.seed_everything(opts.seed, verbose=False)
    module = CompressorDecoderModule(
        compressor=opts.compressor, decoder=opts.decoder, tokenizer=tokenizer,
        num_memory_tokens=None, compression_rate=8, context_tokens=opts.context_tokens,
        lm_weight=0.5,
        optim={"lr": 1e-3, "max_grad_norm": 1.0, "micro_batch_size": opts.micro_batch_size},
    )  # fmt: skip
    module.configure_model()
    return module


def run_lightning(opts: argparse.Namespace, tokenizer: Any, batches: list[Any]) -> Run:
    timer = StepTimer(probes={"loss": lambda trainer, out: out["loss"]})
    loader: DataLoader[Any] = DataLoader(batches, batch_size=None)  # type: ignore[arg-type]
    fit(build_module(opts, tokenizer), [timer], max_steps=len(batches), limit_val_batches=0,
        train_dataloaders=loader)  # fmt: skip
    return timer.column("step"), timer.column("loss")


def run_bare(opts: argparse.Namespace, tokenizer: Any, batches: list[Any]) -> Run:
    """``training_step`` + ``OptimizerStep`` without Lightning: same micro-batches, loss
    scaling, clipping and AdamW settings."""
    module = build_module(opts, tokenizer)
    params = [p for p in module.compressor.parameters() if p.requires_grad]
    hp = module.optim
    optimizer = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay)
    seconds, losses = [], []
    for batch in batches:
        start = time.perf_counter()
        rows, size = batch["input_ids"].shape[0], hp.micro_batch_size
        totals, total = module._token_totals(batch), torch.zeros(())
        optimizer.zero_grad()
        for i in range(0, rows, size):
            part = {k: v[i : i + size] for k, v in batch.items()}
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
    """Per-round medians after warm-up; the ratio per round, then its median; the verdict."""
    medians = {arm: [statistics.median(r[0][warmup:]) for r in rs] for arm, rs in runs.items()}
    lines = ["| arm | median step (ms) | spread over rounds (ms) | ratio vs bare |",
             "|---|---|---|---|"]  # fmt: skip
    for arm, values in medians.items():
        cell = ratio(medians["Lightning"], medians["bare"]) if arm == "Lightning" else "1.000x"
        lines.append(f"| {arm} | {statistics.median(values) * 1e3:.2f} | "
                     f"{min(values) * 1e3:.2f}-{max(values) * 1e3:.2f} | {cell} |")  # fmt: skip
    pairs = zip(medians["Lightning"], medians["bare"], strict=True)
    got = statistics.median(a / b for a, b in pairs)
    verdict = "PASS" if got <= target else "FAIL"
    return [*lines, "", f"{verdict}: Lightning / bare = {got:.3f} (target <= {target:.2f})"]


def same_work(runs: dict[str, list[Run]], tolerance: float) -> tuple[bool, str]:
    """Whether both arms' loss trajectories agree at every step of every round."""
    pairs = [(a, b) for lit, bare in zip(runs["Lightning"], runs["bare"], strict=True)
             for a, b in zip(lit[1], bare[1], strict=True)]  # fmt: skip
    worst = max(abs(a - b) for a, b in pairs)
    ok = worst <= tolerance
    return ok, (
        f"same work: {'OK' if ok else 'MISMATCH'}: first-step loss Lightning "
        f"{runs['Lightning'][0][1][0]:.8f} vs bare {runs['bare'][0][1][0]:.8f}; max |diff| over "
        f"{len(pairs)} steps = {worst:.2e} (tolerance {tolerance:.0e})"
    )


def run(opts: argparse.Namespace, report: Report) -> None:
    from transformers.utils import logging as hf_logging

    if not 0 <= opts.warmup < opts.steps:
        raise SystemExit(f"--warmup ({opts.warmup}) must be in [0, --steps ({opts.steps}))")
    # Lightning's notes on this deliberate setup and the weight-loading bars clutter the table
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*(many workers|val_dataloader|eval mode|LeafSpec)")
    hf_logging.disable_progress_bar()
    tokenizer, batches = collect_batches(opts)
    arms = {"Lightning": run_lightning, "bare": run_bare}
    runs: dict[str, list[Run]] = {arm: [] for arm in arms}
    for r in range(opts.rounds):
        for arm in order(list(arms), r):
            gc.collect()
            runs[arm].append(arms[arm](opts, tokenizer, batches))
    report.ok, check = same_work(runs, opts.tolerance)
    report.say(f"Compressor step, Lightning vs bare PyTorch: {opts.compressor} -> {opts.decoder}, "
               f"{opts.rounds} rounds x {opts.steps} steps (first {opts.warmup} dropped), batch "
               f"{opts.batch_size} (micro {opts.micro_batch_size}) x {opts.context_tokens} "
               "tokens, data loading excluded", "")  # fmt: skip
    report.say(*table(runs, opts.warmup, opts.target), check)
    report.data = {a: [{"seconds": t, "losses": loss} for t, loss in rs] for a, rs in runs.items()}
