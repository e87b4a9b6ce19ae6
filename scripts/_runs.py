"""Helpers shared by the experiment drivers in ``scripts/``: write a LightningCLI config fragment,
run ``python -m lit_rlhf.cli`` in a subprocess and time it, read series from a CSVLogger's
``metrics.csv``.

The drivers run from the repository root (``python scripts/<driver>.py``) and import this file as
``from _runs import ...``; Python puts the script's folder first on ``sys.path``.
"""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

Rows = list[dict[str, str]]


def base_callbacks(config: Path) -> list[Any]:
    """The ``trainer.callbacks`` list of a config, or ``[]``.

    A fragment that sets ``trainer.callbacks`` replaces the base config's list (jsonargparse does
    not merge lists), so fragments start from this one to keep e.g. ``MetricsPlot``.
    """
    base = yaml.safe_load(config.read_text()) or {}
    return list(base.get("trainer", {}).get("callbacks") or [])


def run_fragment(
    out: Path, name: str, seed: int, callbacks: list[Any], *, seed_model: bool = False
) -> dict[str, Any]:
    """A fragment for one seeded run: one CSV logger at ``out/name/seed<seed>/metrics.csv``,
    ``seed_everything`` and the data's shuffling seed set to ``seed``, no progress bar.

    ``seed_model`` also sets ``model.init_args.seed`` (the PPO mini-batch shuffling seed).
    """
    fragment: dict[str, Any] = {
        "seed_everything": seed,
        "trainer": {
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(out), "name": name, "version": f"seed{seed}"},
            },
            "callbacks": callbacks,
            "enable_progress_bar": False,
        },
        "data": {"init_args": {"seed": seed}},
    }
    if seed_model:
        fragment["model"] = {"init_args": {"seed": seed}}
    return fragment


def write_fragment(path: Path, fragment: dict[str, Any]) -> Path:
    """Write ``fragment`` as YAML to ``path`` (creating its folder); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(fragment))
    return path


def cli_command(subcommand: str, configs: list[Path]) -> list[str]:
    """``python -m lit_rlhf.cli <subcommand> --config c1 --config c2 ...`` as an argv list."""
    args = [sys.executable, "-m", "lit_rlhf.cli", subcommand]
    for config in configs:
        args += ["--config", str(config)]
    return args


def run_timed(command: list[str]) -> float:
    """Run ``command`` (raising ``CalledProcessError`` on failure); return its wall time in s."""
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def read_rows(path: Path) -> Rows:
    """The rows of a CSVLogger ``metrics.csv`` (every value a string, ``""`` where not logged)."""
    with path.open() as f:
        return list(csv.DictReader(f))


def series(rows: Rows, key: str) -> list[float]:
    """The logged values of ``key``, in row order (rows without it, or with NaN: not defined
    at that step, are skipped)."""
    return [float(r[key]) for r in rows if r.get(key) not in (None, "", "nan")]


def steps_and_values(
    rows: Rows, key: str, step_key: str = "rollout/step"
) -> list[tuple[int, float]]:
    """``(step, value)`` for the rows that log both ``step_key`` and ``key``."""
    both = [
        r
        for r in rows
        if r.get(key) not in (None, "", "nan") and r.get(step_key) not in (None, "", "nan")
    ]
    return [(round(float(r[step_key])), float(r[key])) for r in both]


def mean_first(xs: list[float], n: int) -> float:
    """Mean of the first ``n`` values (all of them when fewer)."""
    return sum(xs[:n]) / len(xs[:n])


def mean_last(xs: list[float], n: int) -> float:
    """Mean of the last ``n`` values (all of them when fewer)."""
    return sum(xs[-n:]) / len(xs[-n:])


def mean_spread(values: list[float]) -> str:
    """``"mean ± sample std"`` of per-seed values (std 0 for one seed), ``"n/a"`` for none."""
    if not values:
        return "n/a"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {spread:.3f}"


def plot_arms(
    csvs: dict[str, list[Path]],
    keys: Sequence[str],
    path: Path,
    *,
    step_key: str,
    xlabel: str,
    markers: bool = False,
    legend_size: int = 8,
) -> None:
    """One panel per metric key: one colour per arm, one line style per seed run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.5))
    for ax, key in zip(axes, keys, strict=True):
        for colour, (arm, paths) in enumerate(csvs.items()):
            for i, p in enumerate(paths):
                points = (
                    steps_and_values(read_rows(p), key, step_key=step_key) if p.exists() else []
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    style = {"marker": "o", "markersize": 3} if markers else {}
                    ax.plot(xs, ys, color=f"C{colour}", linestyle=("-", "--", ":", "-.")[i % 4],
                            label=f"{arm} ({p.parent.name})", **style)  # fmt: skip
        ax.set_title(key)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
