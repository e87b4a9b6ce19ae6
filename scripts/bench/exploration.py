"""Cost of the exploration terms (no bonus, entropy bonus, TRE-K, TRE-P): PPO step time, and the
peak memory of one entropy forward + backward, each variant in a fresh capped process.

    python -m scripts.bench exploration [--model builtin:small-llama] [--rounds 8 --steps 10]
        [--shape 4 2048 151936] [--skip-steps | --skip-memory]

Workload, method and figures: docs/benchmarks.md, "Exploration cost".
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import Any

from scripts.bench.runner import (
    ChildFailed,
    Report,
    StepTimer,
    fit,
    int_args,
    peak_rss_mib,
    ratio,
    spawn,
)

METHODS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "vanilla": None,
    "entropy bonus": ("EntropyBonus", {"alpha": 0.001}),
    "TRE-K": ("TrustRegionEntropy", {"alpha": 0.001, "mode": "topk", "k": 2}),
    "TRE-P": ("TrustRegionEntropy", {"alpha": 0.001, "mode": "topp", "p": 0.99}),
}
VARIANTS = ("naive autograd", "entropy, unchunked", "entropy, chunked", "TRE-K, chunked",
            "TRE-P, chunked")  # fmt: skip
SMOKE = {"rounds": 1, "steps": 2, "warmup": 1, "shape": [2, 16, 512], "chunk": 8}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="builtin:tiny-llama")
    int_args(parser, rounds=8, steps=10, warmup=1, chunk=1024)
    parser.add_argument("--shape", type=int, nargs=3, default=[4, 2048, 151936])
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument("--memory-limit-gib", type=float, default=20.0,
                        help="address-space cap for each memory child (0 = none)")  # fmt: skip


Spec = tuple[str, dict[str, Any]] | None


def one_run(model: str, spec: Spec, seed: int, steps: int) -> list[float]:
    import lightning as L

    import lit_rlhf.callbacks as cbs
    from lit_rlhf.data import CountdownPrompts, PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import CountdownReward
    from lit_rlhf.rollout import HFGenerationEngine

    L.seed_everything(seed, verbose=False)
    prompts = CountdownPrompts(num_examples=4 * steps, seed=seed, num_numbers=3, max_value=20)
    data = PromptDataModule(tokenizer=model, batch_size=4, train=prompts)
    module = PPOModule(reward=CountdownReward(format_reward=0.1), model=model,
                       tokenizer=data.tokenizer, engine=HFGenerationEngine(max_new_tokens=24),
                       rollout={"samples_per_prompt": 4},
                       optim={"micro_batch_size": 8, "lr": 1e-3})  # fmt: skip
    timer = StepTimer()
    extra = [getattr(cbs, spec[0])(**spec[1])] if spec is not None else []
    fit(module, [timer, *extra], data)
    return timer.column("step")


def step_table(opts: argparse.Namespace, report: Report) -> None:
    times: dict[str, list[list[float]]] = {name: [] for name in METHODS}
    for r in range(opts.rounds):
        for name, spec in METHODS.items():
            times[name].append(one_run(opts.model, spec, r, opts.steps)[opts.warmup :])
    base = [statistics.median(ts) for ts in times["vanilla"]]
    report.say(f"PPO step time, tiny CPU setting with {opts.model} ({opts.rounds} rounds x "
               f"{opts.steps} steps, first {opts.warmup} of each dropped; methods interleaved "
               "within each round):", "")  # fmt: skip
    rows = []
    for name, per_round in times.items():
        flat = [t for ts in per_round for t in ts]
        medians = [statistics.median(ts) for ts in per_round]
        cells = [f"{statistics.median(flat) * 1e3:.1f} ms", f"{min(flat) * 1e3:.1f}-"
                 f"{max(flat) * 1e3:.1f} ms", ratio(medians, base)]  # fmt: skip
        rows.append((name, *cells))
    report.table(["method", "median step", "spread (min-max)", "vs vanilla (median of per-round "
                  "ratios, range)"], rows)  # fmt: skip
    report.data["steps"] = times


def child(opts: argparse.Namespace) -> dict[str, float]:
    """One entropy variant's forward + backward: its peak memory above the logits and time."""
    import torch

    from lit_rlhf.algos import entropy_from_logits, trust_region_entropy

    if opts.memory_limit_gib:  # a clean allocation error instead of the kernel's OOM killer
        limit = int(opts.memory_limit_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    torch.manual_seed(0)
    # drawn in bf16 directly: an fp32 temporary would set a high-water mark above the measurement
    logits = torch.randn(*opts.shape, dtype=torch.bfloat16).mul_(3).requires_grad_(True)
    base, start, chunk = peak_rss_mib(), time.perf_counter(), opts.chunk
    if opts.child == "naive autograd":
        z = logits.float()
        h = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)
        del z
    elif opts.child.startswith("entropy"):
        h = entropy_from_logits(logits, chunk_size=None if "un" in opts.child else chunk)
    else:
        topk = opts.child.startswith("TRE-K")
        mode: dict[str, Any] = {"mode": "topk", "k": 2} if topk else {"mode": "topp", "p": 0.99}
        h, _ = trust_region_entropy(logits, chunk_size=chunk, **mode)
    h.float().mean().backward()
    return {"peak_mib": peak_rss_mib() - base, "seconds": time.perf_counter() - start}


def memory_table(opts: argparse.Namespace, report: Report) -> None:
    shape, limit = opts.shape, opts.memory_limit_gib
    mib = 2 * shape[0] * shape[1] * shape[2] / 2**20
    report.say(f"Entropy forward+backward on bf16 logits {tuple(shape)} ({mib:.0f} MiB), chunk "
               f"{opts.chunk} positions; peak memory above the logits, including their "
               f"{mib:.0f} MiB gradient (which any backward creates):", "")  # fmt: skip
    rows, flags = [], ["--shape", *shape, "--chunk", opts.chunk, "--memory-limit-gib", limit]
    for variant in VARIANTS:
        try:
            r = spawn("exploration", [*flags, "--child", variant])
            rows.append((variant, f"{r['peak_mib']:.0f} MiB", f"{r['seconds']:.2f} s"))
            report.data.setdefault("memory", {})[variant] = r
        except ChildFailed as err:
            rows.append((variant, f"failed within {limit:.0f} GiB: {err.last[:160]}", ""))
    report.table(["variant", "extra peak memory", "time"], rows)


def run(opts: argparse.Namespace, report: Report) -> None:
    if not opts.skip_steps:
        step_table(opts, report)
    if not opts.skip_memory:
        report.say("")
        memory_table(opts, report)
