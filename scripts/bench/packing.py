"""The PPO update step padded (``micro_batch_size``) against packed (``micro_batch_tokens``) on a
synthetic long-tailed GRPO rollout: step times, padded / packed (target >= 1.3x), peak memory.

    python -m scripts.bench packing [--micro-batch-tokens 1024] [--repeats 3]

Figures: docs/benchmarks.md, "Length and group-size sweep"; docs/algorithms.md, "Packing and
token budgets".
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from scripts.bench.runner import Report, int_args, order, spawn, spread

SMOKE = {"model": "builtin:tiny-llama", "prompts": 2, "repeats": 1, "max_len": 32}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="builtin:mid-llama")
    int_args(parser, prompts=8, group_min=4, group_max=8, min_len=16, max_len=256,
             micro_batch_size=8, micro_batch_tokens=1024, repeats=3, seed=0)  # fmt: skip
    parser.add_argument("--log-mean", type=float, default=4.0, help="lognormal mu (e^4 ~ 55)")
    parser.add_argument("--log-std", type=float, default=0.8)


def synthetic_rollout(opts: argparse.Namespace, vocab: int, device: torch.device) -> Any:
    """Left-padded prompts, right-padded long-tailed responses, random scores."""
    from lit_rlhf.types import Rollout

    gen = torch.Generator().manual_seed(opts.seed)
    sizes = torch.randint(opts.group_min, opts.group_max + 1, (opts.prompts,), generator=gen)
    group_ids = torch.arange(opts.prompts).repeat_interleave(sizes)
    b = len(group_ids)
    p_len = torch.randint(16, 33, (opts.prompts,), generator=gen)[group_ids]
    r_len = torch.empty(b).log_normal_(opts.log_mean, opts.log_std, generator=gen)
    r_len = r_len.clamp(opts.min_len, opts.max_len).long()
    p, r = int(p_len.max()), int(r_len.max())
    prompt_mask = torch.arange(p)[None] >= (p - p_len)[:, None]
    response_mask = torch.arange(r)[None] < r_len[:, None]
    prompt_ids = torch.randint(3, vocab, (opts.prompts, p), generator=gen)[group_ids]
    response_ids = torch.randint(3, vocab, (b, r), generator=gen)
    tensors = dict(prompt_ids=prompt_ids * prompt_mask, prompt_mask=prompt_mask,
                   response_ids=response_ids * response_mask, response_mask=response_mask,
                   group_ids=group_ids, scores=torch.rand(b, generator=gen))  # fmt: skip
    return Rollout(**{k: v.to(device) for k, v in tensors.items()}, sample_log_probs=None,
                   query_ids=[str(int(g)) for g in group_ids], tasks=["synthetic"] * b,
                   rows=[{}] * b, prompts=[""] * b, responses=[""] * b, reward_info={})  # fmt: skip


def update_step(policy: Any, optimizer: Any, settings: Any, rollout: Any) -> float:
    """Seconds of one update step: the experience, every micro-batch's forward + backward and
    the optimizer step."""
    from lit_rlhf.training import PPOUpdate, build_experience

    sync = torch.cuda.synchronize if rollout.response_ids.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    kwargs: dict[str, Any] = dict(temperature=1.0, kl_coef=0.0, use_current_as_old=True)
    experience = build_experience(rollout, policy=policy, settings=settings, **kwargs)
    update = PPOUpdate(policy, settings, experience, **kwargs)
    optimizer.zero_grad()
    for micro in update.micro_batches(torch.arange(len(rollout))):
        update.loss(micro).backward()
    optimizer.step()
    sync()
    return time.perf_counter() - start


def setup(opts: argparse.Namespace) -> tuple[Any, Any, dict[str, Any], Any]:
    from lit_rlhf.models import load_causal_lm
    from lit_rlhf.settings import OptimSettings, RolloutSettings, UpdateSettings
    from lit_rlhf.training import PPOSettings

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy: Any = load_causal_lm(opts.model).to(device).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-7)
    rollout = synthetic_rollout(opts, policy.config.vocab_size, device)
    base = PPOSettings(optim=OptimSettings(micro_batch_size=opts.micro_batch_size),
                       rollout=RolloutSettings(samples_per_prompt=opts.group_min))  # fmt: skip
    packed = dataclasses.replace(
        base, update=UpdateSettings(micro_batch_tokens=opts.micro_batch_tokens)
    )
    return policy, optimizer, {"padded": base, "packed": packed}, rollout


def rss_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(opts: argparse.Namespace) -> dict[str, float]:
    """One step of one path in a fresh process: its peak RSS and growth over the step."""
    policy, optimizer, paths, rollout = setup(opts)
    before = rss_mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak RSS restarts from now
    update_step(policy, optimizer, paths[opts.child], rollout)
    return {"peak": rss_mib("VmHWM"), "growth": rss_mib("VmHWM") - before}


def peak(name: str, opts: argparse.Namespace, device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB allocated"
    mem = spawn("packing", [*opts.argv, "--child", name])  # the peak RSS only grows
    return f"{mem['peak']:.0f} MiB RSS, {mem['growth']:+.0f} MiB over the loaded model"


def run(opts: argparse.Namespace, report: Report) -> None:
    policy, optimizer, paths, rollout = setup(opts)
    device, lengths = rollout.response_ids.device, rollout.response_mask.sum(1).float()
    report.say(f"{opts.model} on {device}: {len(rollout)} sequences in {opts.prompts} groups, "
               f"response lengths {int(lengths.min())}-{int(lengths.max())} (mean "
               f"{lengths.mean():.0f}, median {lengths.median():.0f}); padded micro_batch_size="
               f"{opts.micro_batch_size}, packed micro_batch_tokens="
               f"{opts.micro_batch_tokens}")  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in paths}
    peaks: dict[str, str] = {}
    for name, settings in paths.items():  # warm-up, and each path's peak memory
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        update_step(policy, optimizer, settings, rollout)
        peaks[name] = peak(name, opts, device)
    for r in range(opts.repeats):
        for name in order(list(paths), r):
            times[name].append(update_step(policy, optimizer, paths[name], rollout))
            report.say(f"  repeat {r}: {name:6s} {times[name][-1]:.3f} s")
    rows = [(name, spread(t, unit=" s"), peaks[name]) for name, t in times.items()]
    report.table(["path", "step (median, min-max)", "peak memory"], rows)
    speedup = statistics.median(times["padded"]) / statistics.median(times["packed"])
    report.say(f"speed-up padded / packed: {speedup:.2f}x (target >= 1.3x)")
    report.data = {"times": times, "peaks": peaks, "speedup": speedup}
