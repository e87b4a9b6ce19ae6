"""On-policy against one-step-off training (``max_staleness: 1``) on the peer benchmark's GRPO
step, vLLM engine (``--engine hf``: transformers' generate), each run a fresh process.

    .venv-vllm/bin/python -m scripts.bench overlap                 # the measurement
    .venv-vllm/bin/python -m scripts.bench overlap --sizes tiny --steps 2 --warmup 2 --repeats 1

Workload, figures and how to read them: docs/agents.md, "One-step-off training".
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

from scripts.bench.peer_trl import SIZES, run_child
from scripts.bench.runner import Report, int_args, order, spread

MODES = {0: "on-policy", 1: "one-step-off"}
SMOKE = {"sizes": ["tiny"], "steps": 1, "repeats": 1, "engine": "hf", "new_tokens": 8,
         "prompts": 32}  # fmt: skip


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["tiny", "mid"])
    int_args(parser, steps=6, warmup=2, repeats=2, new_tokens=64, prompts=256)
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="hf: generate")


def run_pair(size: str, opts: argparse.Namespace) -> dict[int, dict[str, list[float]]]:
    """Each mode's timed steps pooled over ``opts.repeats`` alternating runs."""
    pooled: dict[int, dict[str, list[float]]] = {}
    for r in range(opts.repeats):
        for k in order([0, 1], r):
            opts.max_staleness = k
            result = run_child(opts, opts.engine, size, 0.0)
            into = pooled.setdefault(k, {"times": [], "gen": []})
            for key, values in {**result["overlap"], "times": result["times"],
                                "gen": result["gen"]}.items():  # fmt: skip
                into.setdefault(key, []).extend(values[opts.warmup :])
    return pooled


def _median(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else float("nan")


def rows(size: str, modes: dict[int, dict[str, list[float]]]) -> list[tuple[Any, ...]]:
    base = 60 / statistics.median(modes[0]["times"])
    out = []
    for k, res in modes.items():
        step = statistics.median(res["times"])
        update = _median(res.get("time/update_s", [])) if k else step - _median(res["gen"])
        hidden = f"{_median(res['rollout/overlap']):.0%}" if k else "-"
        wait = f"{_median(res['time/wait_s']):.2f} s" if k else "-"
        out.append((size, MODES[k], spread(res["times"], ".2f", unit=" s"), f"{60 / step:.1f}",
                    f"{_median(res['gen']):.2f} s", f"{update:.2f} s", hidden, wait,
                    f"{60 / step / base:.2f}x"))  # fmt: skip
    return out


def run(opts: argparse.Namespace, report: Report) -> None:
    if opts.warmup < 2:
        raise SystemExit("--warmup must be >= 2 (one-step-off's first step only generates)")
    opts.micro_batch_tokens, opts.samples = None, 4
    report.say(f"{opts.steps} timed steps after {opts.warmup} warm-up per run, {opts.repeats} "
               f"runs per mode alternating, {opts.threads} threads, {opts.engine} engine; "
               "medians over the timed steps", "")  # fmt: skip
    table = []
    for size in opts.sizes:
        report.data[size] = run_pair(size, opts)
        table += rows(size, report.data[size])
    report.table(["size", "mode", "step", "steps/min", "generation", "update", "hidden", "wait",
                  "vs on-policy"], table)  # fmt: skip
