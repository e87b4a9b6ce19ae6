"""Rerun the TRE paper's exploration comparison (arXiv 2602.03635) with one command: vanilla PPO,
a global entropy bonus, Forking Tokens, KL-Cov, TRE-K and TRE-P on the same task and seeds.

Each (method, seed) is one ``python -m lit_rlhf.cli fit --config <base> --config <fragment>``;
the fragment adds the method's callback with the authors' defaults to the base config's callbacks
and a CSV logger at ``<out>/<method>/seed<k>/metrics.csv``. Afterwards ``<out>/results.md`` (one
row per method, mean ± std over seeds) and ``<out>/curves.png`` are written.

    python scripts/compare_exploration.py --preset cpu    # smoke scale, ~10 min on 2 cores
    python scripts/compare_exploration.py --preset gpu --seeds 0 1 2
    python scripts/compare_exploration.py --methods vanilla tre-k --steps 4 --dry-run

Departures from the paper: the ``cpu`` preset uses SmolLM2-135M-Instruct on easy Countdown with
GRPO advantages and 12 rollout steps (the paper: Qwen2.5 with a learned critic, hundreds of steps);
it keeps the authors' coefficients, so it checks the plumbing, not the paper's claims.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _runs import (
    Rows,
    base_callbacks,
    cli_command,
    mean_last,
    read_rows,
    run_fragment,
    run_timed,
    series,
    steps_and_values,
    write_fragment,
)

CALLBACKS = "lit_rlhf.callbacks"
# The authors' defaults (METHODS.md sec. 1); vanilla PPO adds no callback.
METHODS: dict[str, dict[str, Any] | None] = {
    "vanilla": None,
    "entropy": {"class_path": f"{CALLBACKS}.EntropyBonus", "init_args": {"alpha": 0.001}},
    "forking": {"class_path": f"{CALLBACKS}.ForkingTokens", "init_args": {"top_fraction": 0.2}},
    # the TRE authors' KL-Cov (their fork's compute_policy_loss, kl_cov=True) adds the penalty to
    # the clipped PPO loss of the selected tokens; it does not swap in the unclipped loss
    "klcov": {
        "class_path": f"{CALLBACKS}.KLCov",
        "init_args": {"top_fraction": 0.002, "coef": 1.0, "replace_clip": False},
    },
    "tre-k": {
        "class_path": f"{CALLBACKS}.TrustRegionEntropy",
        "init_args": {"alpha": 0.001, "mode": "topk", "k": 2},
    },
    "tre-p": {
        "class_path": f"{CALLBACKS}.TrustRegionEntropy",
        "init_args": {"alpha": 0.001, "mode": "topp", "p": 0.99},
    },
}

PRESETS: dict[str, dict[str, Any]] = {
    # A rollout step of 4 prompts x 4 samples takes ~5 s on 2 idle cores; the 32 held-out tasks
    # are one greedy validation batch at the end. No checkpoints: only metrics.csv is read.
    "cpu": {
        "config": Path("configs/ppo/countdown_smollm2.yaml"),
        "steps": 12,
        "trainer": {"limit_val_batches": 1, "enable_checkpointing": False},
        "data": {"batch_size": 4, "val_batch_size": 32},
        # two optimizer steps per rollout, so the second sees a ratio != 1: clipping and
        # KL-Cov's |log ratio| penalty act
        "model": {"mini_batch_size": 8},
        "note": (
            "Smoke-scale comparison: SmolLM2-135M-Instruct, easy Countdown, GRPO advantages, "
            "{steps} rollout steps of 4 prompts x 4 samples in two mini-batches of 8 (two "
            "optimizer steps per rollout, so the second one's ratio differs from 1 and clipping "
            "and KL-Cov act), the authors' coefficients (alpha = 0.001 barely moves a 135M model "
            "in this many steps). It checks that every method runs and logs; differences between "
            "rows are within seed noise and say nothing about the paper's claims."
        ),
    },
    "gpu": {
        "config": Path("configs/ppo/countdown_qwen2.5-1.5b.yaml"),
        "steps": None,
        "trainer": {},
        "data": {},
        "model": {},
        "note": (
            "Paper setting (the authors' recipe, docs/recipes.md: Qwen2.5-1.5B-Instruct, "
            "Countdown, PPO with a learned critic, 512 prompts x 8 samples per rollout step in "
            "8 mini-batches), {steps} rollout steps."
        ),
    },
}

# (column header, function of one run's rows -> value or None)
Summary = Callable[[Rows], float | None]


def _last(key: str, n: int = 3) -> Summary:
    def summary(rows: Rows) -> float | None:
        xs = series(rows, key)
        return mean_last(xs, n) if xs else None

    return summary


def _run_mean(key: str) -> Summary:
    def summary(rows: Rows) -> float | None:
        xs = series(rows, key)
        return statistics.fmean(xs) if xs else None

    return summary


COLUMNS: list[tuple[str, Summary]] = [
    ("train reward (last 3 steps)", _last("reward/mean")),
    ("train correct (last 3 steps)", _last("reward/correct")),
    ("val pass@1 (greedy, end)", _last("val/pass@1", n=1)),
    ("entropy, run mean", _run_mean("ppo/entropy")),
    ("entropy, last 3 steps", _last("ppo/entropy")),
    ("TRE entropy, run mean", _run_mean("TrustRegionEntropy/tre_entropy")),
    ("mean abs A_t, run mean", _run_mean("TrustRegionEntropy/region_size")),
]


def method_fragment(
    method: str, seed: int, out: Path, config: Path, preset: dict[str, Any], steps: int | None
) -> dict[str, Any]:
    """The config fragment of one (method, seed) run on top of ``config``."""
    callback = METHODS[method]
    callbacks = base_callbacks(config) + ([callback] if callback else [])
    fragment = run_fragment(out, method, seed, callbacks, seed_model=True)
    fragment["trainer"].update(preset["trainer"])
    if steps is not None:
        fragment["trainer"]["limit_train_batches"] = steps
    fragment["data"]["init_args"].update(preset["data"])
    fragment.setdefault("model", {}).setdefault("init_args", {}).update(preset["model"])
    return fragment


def _cell(values: Sequence[float | None], fmt: str) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "n/a"
    if len(present) == 1:
        return format(present[0], fmt)
    return f"{statistics.fmean(present):{fmt}} ± {statistics.stdev(present):{fmt}}"


def results_table(
    runs: dict[str, list[Rows | None]], seconds: dict[str, list[float | None]]
) -> str:
    """Markdown table, one row per method; a cell is the mean ± std over seeds (sample std; the
    value alone with one seed). ``None`` marks a failed run."""
    header = ["method", *(name for name, _ in COLUMNS), "wall time per run (s)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, method_runs in runs.items():
        done = [rows for rows in method_runs if rows is not None]
        cells = [_cell([summary(rows) for rows in done], ".3f") for _, summary in COLUMNS]
        wall = _cell(seconds.get(method, []), ".0f")
        failed = len(method_runs) - len(done)
        name = f"{method} ({failed} failed)" if failed else method
        lines.append("| " + " | ".join([name, *cells, wall]) + " |")
    return "\n".join(lines)


def mean_curve(runs: Sequence[Rows], key: str) -> tuple[list[int], list[float]]:
    """Mean of ``key`` over runs per rollout step (a step averages the runs that logged it)."""
    by_step: dict[int, list[float]] = {}
    for rows in runs:
        for step, value in steps_and_values(rows, key):
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    return steps, [statistics.fmean(by_step[s]) for s in steps]


def plot_curves(runs: dict[str, list[Rows | None]], path: Path) -> None:
    """Two panels, reward/mean and ppo/entropy per rollout step, one mean curve per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["reward/mean", "ppo/entropy"]
    fig, axes = plt.subplots(1, len(keys), figsize=(11, 4))
    for ax, key in zip(axes, keys, strict=True):
        for method, method_runs in runs.items():
            steps, values = mean_curve([r for r in method_runs if r is not None], key)
            if steps:
                ax.plot(steps, values, marker=".", label=method)
        ax.set_xlabel("rollout step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_results(
    out: Path,
    methods: Sequence[str],
    seeds: Sequence[int],
    seconds: dict[str, list[float | None]],
    header: str,
    footer: str = "",
) -> str:
    """Read ``<out>/<method>/seed<k>/metrics.csv``; write ``results.md`` (header, table, curves,
    footer) and ``curves.png``; return the table. ``seconds[method]`` holds one wall time per
    seed, ``None`` for a failed run (whose partial or stale metrics.csv is then ignored), as is a
    missing metrics.csv."""
    runs: dict[str, list[Rows | None]] = {}
    for method in methods:
        runs[method] = []
        for seed, wall in zip(seeds, seconds[method], strict=True):
            path = out / method / f"seed{seed}" / "metrics.csv"
            runs[method].append(read_rows(path) if wall is not None and path.exists() else None)
    table = results_table(runs, seconds)
    body = f"{header}\n\n{table}\n\n![curves](curves.png)\n"
    (out / "results.md").write_text(body + (f"\n{footer}\n" if footer else ""))
    plot_curves(runs, out / "curves.png")
    return table


def _header(opts: argparse.Namespace, preset: dict[str, Any]) -> str:
    steps = opts.steps if opts.steps is not None else "the config's"
    return (
        "# Exploration methods compared (TRE, arXiv 2602.03635)\n\n"
        f"{preset['note'].format(steps=steps)}\n\n"
        f"Base config `{opts.config}`; seeds {list(opts.seeds)}. Train columns average the last "
        "3 rollout steps; entropy is the full-vocabulary entropy (`ppo/entropy`); the TRE "
        "columns are logged by TRE runs only. Cells are mean ± std over seeds."
    )


def _footer(commands: list[list[str]], load: tuple[float, float]) -> str:
    # wall times on a shared machine are only comparable with the load they ran under
    runs = "\n".join(shlex.join(c) for c in commands)
    return (
        f"Wall times include model loading and the final validation; 1-minute load average "
        f"{load[0]:.1f} at the start and {load[1]:.1f} at the end, on {os.cpu_count()} CPUs.\n\n"
        f"Command:\n\n```\npython {shlex.join(sys.argv)}\n```\n\nRuns:\n\n```\n{runs}\n```"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, help="rollout steps per run (default: the preset's)")
    parser.add_argument("--out", type=Path, default=Path("runs/compare_exploration"))
    parser.add_argument("--config", type=Path, help="base config (default: the preset's)")
    parser.add_argument(
        "--dry-run", action="store_true", help="write the fragments, print the commands, stop"
    )
    opts = parser.parse_args(argv)
    preset = PRESETS[opts.preset]
    opts.config = opts.config or preset["config"]
    opts.steps = opts.steps if opts.steps is not None else preset["steps"]
    if opts.steps is not None and opts.steps < 1:
        parser.error(f"--steps must be >= 1, got {opts.steps}")
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    preset = PRESETS[opts.preset]
    jobs: list[tuple[str, list[str]]] = []
    for method in opts.methods:
        for seed in opts.seeds:
            fragment = method_fragment(method, seed, opts.out, opts.config, preset, opts.steps)
            path = write_fragment(opts.out / f"{method}-seed{seed}.yaml", fragment)
            jobs.append((method, cli_command("fit", [opts.config, path])))
    if opts.dry_run:
        print("\n".join(shlex.join(command) for _, command in jobs))
        return
    seconds: dict[str, list[float | None]] = {m: [] for m in opts.methods}
    load_start = os.getloadavg()[0]
    for method, command in jobs:
        print(f"--- {shlex.join(command)}", flush=True)
        try:
            seconds[method].append(run_timed(command))
        except subprocess.CalledProcessError as err:
            print(f"--- {method} failed with exit code {err.returncode}", flush=True)
            seconds[method].append(None)
    footer = _footer([command for _, command in jobs], (load_start, os.getloadavg()[0]))
    header = _header(opts, preset)
    table = write_results(opts.out, opts.methods, opts.seeds, seconds, header, footer)
    print(table)
    print(f"wrote {opts.out / 'results.md'} and {opts.out / 'curves.png'}")


if __name__ == "__main__":
    main()
