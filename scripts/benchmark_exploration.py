"""Cost of the exploration terms, measured side by side in one run.

1. PPO step time on the tiny CPU setting (configs/ppo/countdown_tre_tiny.yaml's model and task,
   or the same task with ``--model``)
   with no bonus, the global entropy bonus, TRE-K and TRE-P: methods interleaved over rounds,
   median per-step wall time after warm-up, ratio to vanilla.
2. Peak memory (and time) of one entropy forward + backward on bf16 logits of shape
   (4, 2048, 151936) (Qwen2.5's padded vocabulary): full-vocabulary entropy unchunked vs chunked,
   TRE-K and TRE-P, and plain autograd through an fp32 softmax for reference. Each variant runs
   in a fresh process under an address-space cap; memory is that process's peak RSS above the
   logits.

    python scripts/benchmark_exploration.py [--model builtin:small-llama] [--rounds 8 --steps 10]
        [--shape 4 2048 151936] [--skip-steps | --skip-memory]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

METHODS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "vanilla": None,
    "entropy bonus": ("EntropyBonus", {"alpha": 0.001}),
    "TRE-K": ("TrustRegionEntropy", {"alpha": 0.001, "mode": "topk", "k": 2}),
    "TRE-P": ("TrustRegionEntropy", {"alpha": 0.001, "mode": "topp", "p": 0.99}),
}


def step_times(model: str, rounds: int, steps: int, warmup: int) -> dict[str, list[list[float]]]:
    """Per method, one list of timed step durations per round."""
    import lightning as L

    import lit_rlhf.callbacks as cbs
    from lit_rlhf.data import CountdownPrompts, PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import CountdownReward
    from lit_rlhf.rollout import HFGenerationEngine

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, *args: Any) -> None:
            self.times.append(time.perf_counter() - self.start)

    results: dict[str, list[list[float]]] = {name: [] for name in METHODS}
    for r in range(rounds):
        for name, spec in METHODS.items():
            L.seed_everything(r, verbose=False)
            data = PromptDataModule(
                tokenizer=model,
                batch_size=4,
                train=CountdownPrompts(num_examples=4 * steps, seed=r, num_numbers=3, max_value=20),
            )
            module = PPOModule(
                reward=CountdownReward(format_reward=0.1),
                model=model,
                tokenizer=data.tokenizer,
                engine=HFGenerationEngine(max_new_tokens=24),
                samples_per_prompt=4,
                micro_batch_size=8,
                lr=1e-3,
            )
            timer = StepTimer()
            callbacks: list[Any] = [timer]
            if spec is not None:
                callbacks.append(getattr(cbs, spec[0])(**spec[1]))
            L.Trainer(
                accelerator="cpu",
                max_epochs=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                callbacks=callbacks,
            ).fit(module, datamodule=data)
            results[name].append(timer.times[warmup:])
    return results


def step_table(model: str, rounds: int, steps: int, warmup: int) -> list[str]:
    """Median step per method, and the ratio to vanilla as the median over rounds of
    (method's median / vanilla's median in the same round): a burst of machine noise then skews
    one round, not the estimate."""
    times = step_times(model, rounds, steps, warmup)
    base = [statistics.median(ts) for ts in times["vanilla"]]
    lines = [
        f"PPO step time, tiny CPU setting with {model} ({rounds} rounds x {steps} steps, "
        f"first {warmup} of each dropped; methods interleaved within each round):",
        "",
        "| method | median step | spread (min-max) | vs vanilla (median of per-round ratios) | "
        "per-round ratio range |",
        "|---|---|---|---|---|",
    ]
    for name, per_round in times.items():
        flat = [t for ts in per_round for t in ts]
        ratios = [statistics.median(ts) / b for ts, b in zip(per_round, base, strict=True)]
        lines.append(
            f"| {name} | {statistics.median(flat) * 1000:.1f} ms | {min(flat) * 1000:.1f}-"
            f"{max(flat) * 1000:.1f} ms | {statistics.median(ratios):.3f}x | "
            f"{min(ratios):.3f}-{max(ratios):.3f} |"
        )
    return lines


def memory_child(variant: str, shape: list[int], chunk: int, limit_gib: float) -> dict[str, float]:
    import torch

    from lit_rlhf.algos import entropy_from_logits, trust_region_entropy

    if limit_gib:
        # fail with a clean allocation error instead of waking the kernel's OOM killer
        limit = int(limit_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    torch.manual_seed(0)
    # drawn in bf16 directly: an fp32 temporary would set a high-water mark above the measurement
    logits = torch.randn(*shape, dtype=torch.bfloat16).mul_(3).requires_grad_(True)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if variant == "naive autograd":
        z = logits.float()
        h = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)
        del z
    elif variant == "entropy, unchunked":
        h = entropy_from_logits(logits, chunk_size=None)
    elif variant == "entropy, chunked":
        h = entropy_from_logits(logits, chunk_size=chunk)
    elif variant == "TRE-K, chunked":
        h, _ = trust_region_entropy(logits, mode="topk", k=2, chunk_size=chunk)
    else:
        h, _ = trust_region_entropy(logits, mode="topp", p=0.99, chunk_size=chunk)
    h.float().mean().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": (peak - base) / 1024, "seconds": seconds}


def memory_table(shape: list[int], chunk: int, limit_gib: float) -> list[str]:
    logits_mib = 2 * shape[0] * shape[1] * shape[2] / 2**20
    lines = [
        f"Entropy forward+backward on bf16 logits {tuple(shape)} ({logits_mib:.0f} MiB), chunk "
        f"{chunk} positions; peak memory above the logits, including their {logits_mib:.0f} MiB "
        "gradient (which any backward creates):",
        "",
        "| variant | extra peak memory | time |",
        "|---|---|---|",
    ]
    variants = (
        "naive autograd",
        "entropy, unchunked",
        "entropy, chunked",
        "TRE-K, chunked",
        "TRE-P, chunked",
    )
    for variant in variants:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--shape",
                *map(str, shape),
                "--chunk",
                str(chunk),
                "--memory-limit-gib",
                str(limit_gib),
            ],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["killed"])[-1][:160]
            lines.append(f"| {variant} | failed within {limit_gib:.0f} GiB: {last} | |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        lines.append(f"| {variant} | {r['peak_mib']:.0f} MiB | {r['seconds']:.2f} s |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="builtin:tiny-llama")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--shape", type=int, nargs=3, default=[4, 2048, 151936])
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument(
        "--memory-limit-gib",
        type=float,
        default=20.0,
        help="address-space cap for each memory child (0 = none)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(memory_child(opts.child, opts.shape, opts.chunk, opts.memory_limit_gib)))
        return
    lines: list[str] = []
    if not opts.skip_steps:
        lines += step_table(opts.model, opts.rounds, opts.steps, opts.warmup)
    if not opts.skip_memory:
        lines += ["", *memory_table(opts.shape, opts.chunk, opts.memory_limit_gib)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
