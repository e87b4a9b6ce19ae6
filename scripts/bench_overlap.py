"""On-policy against one-step-off training (``max_staleness: 1``), side by side in one run.

Workload: scripts/benchmark.py's GRPO step (8 Countdown-style prompts x 4 samples, up to 64 new
tokens, random-weight ``builtin:small-llama`` "tiny" and ``builtin:mid-llama`` "mid", fp32, one
update per rollout) with the vLLM engine (compiled, colocated in-process; ``--engine hf``:
transformers' generate on a snapshot copy of the policy). Each run is a fresh
process; ``--repeats`` runs per mode alternate (A B, B A, ...); the first ``--warmup`` steps of
each run are dropped (vLLM compiles inside the first; one-step-off's first step only generates).

Printed per size and mode: the median step time (min-max) and steps per minute, the time in
generation and in the update per step, and for one-step-off the share of the generation that ran
while the update did (``rollout/overlap``) and the time the step waited for the worker after the
update; then one-step-off / on-policy steps per minute. On 2 CPU cores generation and update
compete for the same cores, so the hidden share is not a speed-up by itself: the ratio is the
figure. The GPU figure comes from scripts/gpu_check.sh.

    .venv-vllm/bin/python scripts/bench_overlap.py                       # the measurement
    .venv-vllm/bin/python scripts/bench_overlap.py --sizes tiny --steps 2 --warmup 2 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

import benchmark  # scripts/benchmark.py: the workload and its child process

MODES = {0: "on-policy", 1: "one-step-off"}


def run_pair(size: str, opts: argparse.Namespace) -> dict[int, dict[str, list[float]]]:
    """Each mode's timed steps pooled over ``opts.repeats`` alternating runs."""
    pooled: dict[int, dict[str, list[float]]] = {}
    for r in range(opts.repeats):
        for k in (0, 1) if r % 2 == 0 else (1, 0):
            opts.max_staleness = k
            result = benchmark.spawn(opts.engine, size, 0.0, opts)
            into = pooled.setdefault(k, {"times": [], "gen": []})
            into["times"] += result["times"][opts.warmup :]
            into["gen"] += result["gen"][opts.warmup :]
            for key, values in result["overlap"].items():
                into.setdefault(key, []).extend(values[opts.warmup :])
    return pooled


def _median(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else float("nan")


def table(results: dict[str, dict[int, dict[str, list[float]]]]) -> list[str]:
    lines = [
        "| size | mode | step | steps/min | generation | update | hidden | wait | vs on-policy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, modes in results.items():
        base = 60 / statistics.median(modes[0]["times"])
        for k, res in modes.items():
            step = statistics.median(res["times"])
            update = _median(res.get("time/update_s", [])) if k else step - _median(res["gen"])
            hidden = f"{_median(res['rollout/overlap']):.0%}" if k else "-"
            wait = f"{_median(res['time/wait_s']):.2f} s" if k else "-"
            lines.append(
                f"| {size} | {MODES[k]} | {step:.2f} s ({min(res['times']):.2f}-"
                f"{max(res['times']):.2f}) | {60 / step:.1f} | {_median(res['gen']):.2f} s | "
                f"{update:.2f} s | {hidden} | {wait} | {60 / step / base:.2f}x |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sizes = list(benchmark.SIZES)
    parser.add_argument("--sizes", nargs="+", choices=sizes, default=["tiny", "mid"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--engine", choices=["vllm", "hf"], default="vllm", help="hf: transformers generate"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the pooled steps as JSON")
    opts = parser.parse_args()
    if opts.warmup < 2:
        parser.error("--warmup must be >= 2 (one-step-off's first step only generates)")
    opts.micro_batch_tokens = None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    print(
        f"{opts.steps} timed steps after {opts.warmup} warm-up per run, {opts.repeats} runs per "
        f"mode alternating, {opts.threads} threads, {opts.engine} engine; medians over the "
        "timed steps",
        flush=True,
    )
    results: dict[str, Any] = {}
    for size in opts.sizes:
        results[size] = run_pair(size, opts)
        print("\n".join(table({size: results[size]})), flush=True)
    print("\n".join(["", *table(results)]))
    if opts.out is not None:
        opts.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
