"""The PPO update step padded (``micro_batch_size``) against packed (``micro_batch_tokens``).

Workload: a synthetic GRPO rollout on ``builtin:mid-llama`` (random weights, fp32) whose response
lengths have a long tail (lognormal, clamped to ``--min-len``..``--max-len`` tokens), groups of
``--group-min``..``--group-max`` samples per prompt, prompts of 16-32 tokens. One optimizer step
over the whole rollout (the experience's log-probs are the current policy's, one update per
rollout); the two paths alternate (A B, B A, ...) after one warm-up step each, so slow drifts of
the machine hit both. Printed: each timed step, the medians, padded / packed (target >= 1.3x)
and the peak memory of each path (CUDA: ``max_memory_allocated``; CPU: the peak RSS of a fresh
process that runs one step of that path only, from the start of the step (Linux ``clear_refs``),
and its growth over the RSS before the step).

    python scripts/bench_packing.py                                   # the measurement
    python scripts/bench_packing.py --model builtin:tiny-llama --prompts 2 --repeats 1 \\
        --max-len 32                                                  # a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lit_rlhf.models import load_causal_lm
from lit_rlhf.training import PPOSettings, PPOUpdate, build_experience
from lit_rlhf.types import Rollout


def synthetic_rollout(opts: argparse.Namespace, vocab: int, device: torch.device) -> Rollout:
    """Left-padded prompts, right-padded long-tailed responses, random scores."""
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
    return Rollout(
        prompt_ids=(prompt_ids * prompt_mask).to(device),
        prompt_mask=prompt_mask.to(device),
        response_ids=(response_ids * response_mask).to(device),
        response_mask=response_mask.to(device),
        sample_log_probs=None,
        group_ids=group_ids.to(device),
        query_ids=[str(int(g)) for g in group_ids],
        tasks=["synthetic"] * b,
        rows=[{}] * b,
        prompts=[""] * b,
        responses=[""] * b,
        scores=torch.rand(b, generator=gen).to(device),
        reward_info={},
    )


def update_step(policy: Any, optimizer: Any, settings: PPOSettings, rollout: Rollout) -> float:
    """Seconds of one update step: the experience, every micro-batch's forward + backward and
    the optimizer step."""
    sync = torch.cuda.synchronize if rollout.response_ids.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    experience = build_experience(
        rollout, policy=policy, settings=settings, temperature=1.0, kl_coef=0.0,
        use_current_as_old=True,
    )  # fmt: skip
    update = PPOUpdate(
        policy, settings, experience, temperature=1.0, kl_coef=0.0, use_current_as_old=True
    )
    optimizer.zero_grad()
    for micro in update.micro_batches(torch.arange(len(rollout))):
        update.loss(micro).backward()
    optimizer.step()
    sync()
    return time.perf_counter() - start


def rss_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:mid-llama")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-min", type=int, default=4)
    parser.add_argument("--group-max", type=int, default=8)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--log-mean", type=float, default=4.0, help="lognormal mu (e^4 ~ 55)")
    parser.add_argument("--log-std", type=float, default=0.8)
    parser.add_argument("--micro-batch-size", type=int, default=8, help="the padded path's")
    parser.add_argument("--micro-batch-tokens", type=int, default=1024, help="the packed path's")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-of", choices=["padded", "packed"], help=argparse.SUPPRESS)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy: Any = load_causal_lm(opts.model)
    policy = policy.to(device).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-7)
    rollout = synthetic_rollout(opts, policy.config.vocab_size, device)
    base = PPOSettings(micro_batch_size=opts.micro_batch_size, samples_per_prompt=opts.group_min)
    paths = {
        "padded": base,
        "packed": dataclasses.replace(base, micro_batch_tokens=opts.micro_batch_tokens),
    }
    lengths = rollout.response_mask.sum(1).float()
    print(
        f"{opts.model} on {device}: {len(rollout)} sequences in {opts.prompts} groups, response "
        f"lengths {int(lengths.min())}-{int(lengths.max())} (mean {lengths.mean():.0f}, "
        f"median {lengths.median():.0f}); padded micro_batch_size={opts.micro_batch_size}, "
        f"packed micro_batch_tokens={opts.micro_batch_tokens}"
    )
    if opts.memory_of is not None:  # a child process: one step of one path, its memory
        before = rss_mb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak RSS restarts from now
        update_step(policy, optimizer, paths[opts.memory_of], rollout)
        peak = rss_mb("VmHWM")
        print(json.dumps({"peak": peak, "growth": peak - before}))
        return
    times: dict[str, list[float]] = {name: [] for name in paths}
    peaks: dict[str, str] = {}
    for name, settings in paths.items():  # warm-up, and each path's peak memory
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        update_step(policy, optimizer, settings, rollout)
        if device.type == "cuda":
            peaks[name] = f"{peak_mb(device):.0f} MiB allocated"
        else:  # the peak RSS only grows: each path measured in a process of its own
            child = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--memory-of", name],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            mem = json.loads(child.stdout.strip().splitlines()[-1])
            grew = f"{mem['growth']:+.0f} MiB over the loaded model"
            peaks[name] = f"{mem['peak']:.0f} MiB RSS, {grew}"
    for r in range(opts.repeats):
        for name in list(paths) if r % 2 == 0 else list(paths)[::-1]:
            seconds = update_step(policy, optimizer, paths[name], rollout)
            times[name].append(seconds)
            print(f"  repeat {r}: {name:6s} {seconds:.3f} s", flush=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, median in medians.items():
        print(f"{name:6s}: median {median:.3f} s, peak memory {peaks[name]}")
    print(
        f"speed-up padded / packed: {medians['padded'] / medians['packed']:.2f}x (target >= 1.3x)"
    )


if __name__ == "__main__":
    main()
