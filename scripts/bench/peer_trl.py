"""lit-rlhf against TRL's GRPOTrainer on the identical GRPO workload, each run a fresh process,
frameworks alternating; step time, time in generation and the multiple of the compute limit.

    make benchmark                      # builds .venv-vllm (TRL + vLLM + lit-rlhf), runs all
    .venv-vllm/bin/python -m scripts.bench peer_trl --sizes tiny --betas 0 --steps 3 --warmup 1

``--engines vllm decode hf`` adds lit-rlhf's decode loop and transformers' ``generate``;
``--sweep`` times the (response length x group size) grid instead. Workload and figures:
docs/benchmarks.md, "Peer benchmark" and "Length and group-size sweep".
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from scripts.bench.op_profile import OpProfile
from scripts.bench.peer_sides import PROMPTS_PER_STEP, prompt_stats, run_lit_rlhf, run_trl
from scripts.bench.runner import Report, int_args, order, peak_rss_mib, spawn

SIZES = {"tiny": "builtin:small-llama", "mid": "builtin:mid-llama"}
LABELS = {"vllm": "lit-rlhf, vLLM engine", "decode": "lit-rlhf, decode loop",
          "hf": "lit-rlhf, HF generate", "trl": "TRL GRPOTrainer"}  # fmt: skip
PROFILES: dict[tuple[str, float, str], dict[str, Any]] = {}  # (size, beta, kind): op_profile's
SMOKE = {"sizes": ["tiny"], "betas": [0.0], "steps": 1, "warmup": 1, "repeats": 1,
         "engines": ["decode"], "new_tokens": 8, "prompts": 16}  # fmt: skip


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--betas", nargs="+", type=float, default=[0.0, 0.04])
    int_args(parser, steps=10, warmup=2, repeats=2, new_tokens=64, samples=4, prompts=256,
             max_staleness=0)  # fmt: skip
    parser.add_argument("--engines", nargs="+", choices=["vllm", "decode", "hf"], default=["vllm"])
    parser.add_argument("--sweep", action="store_true", help="the (length x group size) grid")
    parser.add_argument("--sweep-lengths", nargs="+", type=int, default=[32, 64, 128, 256])
    parser.add_argument("--sweep-groups", nargs="+", type=int, default=[2, 4, 8, 16])
    parser.add_argument("--micro-batch-tokens", type=int, default=None,
                        help="lit-rlhf's update packed in micro-batches of N tokens")  # fmt: skip
    parser.add_argument(
        "--profile",
        action="store_true",
        help="torch.profiler over the timed steps of each framework's first run: "
        "CPU seconds per step by operator kind, in and out of generation",
    )
    parser.add_argument("--size", choices=list(SIZES), help=argparse.SUPPRESS)  # a child's
    parser.add_argument("--beta", type=float, help=argparse.SUPPRESS)


def forward_flops(config: Any, tokens: int, context: int, lm_head_tokens: int) -> float:
    """Matmul FLOPs of one forward over ``tokens`` positions that each attend to ``context``
    keys on average, with the LM head applied at ``lm_head_tokens`` positions."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    kv = h * config.num_key_value_heads // config.num_attention_heads
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * inter  # qkv, o, gate/up/down
    attention = 4 * h * context  # QK^T and AV per token per layer
    head = lm_head_tokens * 2 * h * config.vocab_size
    return tokens * layers * (2 * per_layer + attention) + head


def step_flops(config: Any, prompt_len: float, response_len: float, beta: float, b: int) -> float:
    """Compute-only FLOPs of one optimizer step of ``b`` sequences (8 prompts x samples)."""
    p, r = prompt_len, response_len
    prefill = forward_flops(config, int(b * p), int(p / 2), b)
    decode = forward_flops(config, int(b * r), int(p + r / 2), int(b * r))
    full = forward_flops(config, int(b * (p + r)), int((p + r) / 2), int(b * r))
    return prefill + decode + full * (3 + (1 if beta > 0 else 0))


def child(opts: argparse.Namespace) -> dict[str, Any]:
    """One run of one framework in this fresh process."""
    total, model = opts.warmup + opts.steps, SIZES[opts.size]
    opts.profiler = OpProfile(opts.warmup) if opts.profile else None
    if opts.child == "trl":
        result = run_trl(opts, model, opts.beta, total)
    else:
        result = run_lit_rlhf(opts, model, opts.beta, total, opts.child)
    cuda = torch.cuda.is_available()
    result["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mib()
    return result | ({"profile": opts.profiler.summary()} if opts.profile else {})


def run_child(opts: argparse.Namespace, kind: str, size: str, beta: float) -> dict[str, Any]:
    flags = {"--size": size, "--beta": beta, "--steps": opts.steps, "--warmup": opts.warmup,
             "--threads": opts.threads, "--new-tokens": opts.new_tokens,
             "--samples": opts.samples, "--prompts": opts.prompts,
             "--max-staleness": opts.max_staleness, "--child": kind}  # fmt: skip
    extra = ["--profile"] if opts.profile else []
    if opts.micro_batch_tokens is not None:
        flags["--micro-batch-tokens"] = opts.micro_batch_tokens
    return spawn("peer_trl", [str(x) for pair in flags.items() for x in pair] + extra)


def measure(opts: argparse.Namespace, size: str, beta: float) -> dict[str, dict[str, list[float]]]:
    """Each framework's timed steps pooled over ``opts.repeats`` runs in alternating order, and
    each run's peak memory."""
    kinds = [*opts.engines, "trl"]
    pooled = {kind: {"times": [], "gen": [], "lengths": [], "peak_mb": []} for kind in kinds}
    for r in range(opts.repeats):
        for kind in order(kinds, r):
            result = run_child(opts, kind, size, beta)
            if "profile" in result:
                PROFILES.setdefault((size, beta, kind), result["profile"])
            for key, values in pooled[kind].items():
                peak = key == "peak_mb"
                got = [result.get(key, float("nan"))] if peak else result[key][opts.warmup :]
                values.extend(got)
    return pooled


def rows(opts: argparse.Namespace, size: str, beta: float, rate: float) -> list[dict[str, Any]]:
    """One summary per framework: median/min/max step, generation, length, x compute limit."""
    config, prompt_len = prompt_stats(opts, SIZES[size])
    out = []
    for kind, result in measure(opts, size, beta).items():
        times = result["times"]
        if not times:
            raise RuntimeError(f"{LABELS[kind]}: no timed steps; raise --steps")
        length = statistics.fmean(result["lengths"] or [opts.new_tokens])
        b = PROMPTS_PER_STEP * opts.samples
        limit = step_flops(config, prompt_len, length, beta, b) / rate
        median = statistics.median(times)
        out.append({"kind": kind, "median": median, "min": min(times), "max": max(times),
                    "gen": statistics.median(result["gen"]), "length": length,
                    "x_limit": median / limit, "per_s": b / median,
                    "peak_mb": max(result["peak_mb"])})  # fmt: skip
    return out


def sweep(opts: argparse.Namespace, report: Report, rate: float) -> None:
    """Step time, x compute limit and peak memory per (response length, group size) point."""
    size, beta, table = opts.sizes[0], opts.betas[0], []
    for new_tokens in opts.sweep_lengths:
        for group in opts.sweep_groups:
            opts.new_tokens, opts.samples = new_tokens, group
            for s in rows(opts, size, beta, rate):
                table.append((size, f"{beta:g}", new_tokens, group, LABELS[s["kind"]],
                              f"{s['median']:.3f} s", f"{s['x_limit']:.2f}x",
                              f"{s['peak_mb']:.0f}"))  # fmt: skip
                point = {**s, "new_tokens": new_tokens, "group": group}
                report.data.setdefault("sweep", []).append(point)
    report.table(["size", "beta", "new tokens", "group", "framework", "step",
                  "x compute limit", "peak MiB"], table)  # fmt: skip


def run(opts: argparse.Namespace, report: Report) -> None:
    rate = report.machine["gemm_start"]["fp32"]
    report.say(f"{opts.steps} timed optimizer steps after {opts.warmup} warm-up per run, "
               f"{opts.repeats} fresh-process runs per framework alternating, medians (min-max) "
               "over all timed steps; x compute limit uses the fp32 GEMM rate at the start.",
               "")  # fmt: skip
    if opts.sweep:
        sweep(opts, report, rate)
        return
    table = []
    for size in opts.sizes:
        for beta in opts.betas:
            summary = rows(opts, size, beta, rate)
            trl = next(s["median"] for s in summary if s["kind"] == "trl")
            for s in summary:
                table.append((size, f"{beta:g}", LABELS[s["kind"]],
                              f"{s['median']:.3f} s ({s['min']:.3f}-{s['max']:.3f})",
                              f"{s['gen']:.3f} s", f"{s['per_s']:.1f}", f"{s['length']:.1f}",
                              f"{s['x_limit']:.2f}x", f"{trl / s['median']:.2f}x"))  # fmt: skip
            report.data[f"{size}/beta={beta:g}"] = summary
    report.table(["size", "beta", "framework", "step", "in generation", "completions/s",
                  "mean length", "x compute limit", "vs TRL"], table)  # fmt: skip
    report.say("", "'vs TRL' = TRL's median step time / this row's (throughput ratio).")
    if PROFILES:
        profile_tables(report)


def profile_tables(report: Report) -> None:
    """``--profile``'s tables: CPU s per step by operator kind; the top operators outside
    generation (the rollout's scoring and log-probs, the update)."""
    cats, top = [], []
    for (size, beta, kind), prof in PROFILES.items():
        key = (size, f"{beta:g}", LABELS[kind])
        cats += [(*key, c, f"{v['generation']:.3f}", f"{v['rest']:.3f}")
                 for c, v in sorted(prof["categories"].items())]  # fmt: skip
        top += [(*key, name, f"{seconds:.3f}") for name, seconds in prof["top_rest"]]
        report.data[f"profile/{size}/beta={beta:g}/{kind}"] = prof
    report.table(["size", "beta", "framework", "operators", "in generation", "outside"], cats)
    report.table(["size", "beta", "framework", "top operator outside generation", "s/step"], top)
