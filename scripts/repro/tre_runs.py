"""The running half of the TRE comparison (``scripts/repro/tre.py``): config fragments for one
Countdown difficulty, ``lit-rlhf validate`` / ``fit`` run in process (one import of torch and
Lightning for the whole preset), and the figures read back from the run's ``metrics.csv``.

Every generation and reward goes through the library: the PPO module's validation (greedy
pass@1, and pass@k of ``eval.samples`` engine samples) and its training loop; the mechanism
figures are ``TrustRegionDiagnostics``' logs.
"""

from __future__ import annotations

import copy
import math
import statistics
from pathlib import Path
from typing import Any

from repro.runs import cli_in_process, read_rows, steps_and_values, write_fragment

DIAGNOSTICS = "lit_rlhf.callbacks.TrustRegionDiagnostics"

# figure name -> logged key (per rollout step)
CURVES: dict[str, str] = {
    "tail_mass_topk": "TrustRegionDiagnostics/tail_mass_topk",
    "tail_mass_topp": "TrustRegionDiagnostics/tail_mass_topp",
    "entropy_topk": "TrustRegionDiagnostics/entropy_topk",
    "entropy_topp": "TrustRegionDiagnostics/entropy_topp",
    "region_size_topp": "TrustRegionDiagnostics/region_size_topp",
    "entropy_full": "ppo/entropy",
    "reward": "reward/mean",
    "correct": "reward/correct",
}
END_STEPS = 3  # "at the end of training" = the mean of the last 3 rollout steps


def countdown_args(difficulty: dict[str, Any], num_examples: int, seed: int) -> dict[str, Any]:
    """``CountdownPrompts`` init_args of one difficulty (its ``name`` is a label only)."""
    args = {k: v for k, v in difficulty.items() if k != "name"}
    return {**args, "num_examples": num_examples, "seed": seed}


def model_args(settings: dict[str, Any]) -> dict[str, Any]:
    """The preset's ``model.init_args`` (settings groups: ``update``, ``optim`` ...; copied, so
    a run's seed never lands in the preset) with ``eval.samples`` = k."""
    args = copy.deepcopy(settings.get("model", {}))
    args.setdefault("eval", {})["samples"] = settings["k"]
    return args


def eval_fragment(settings: dict[str, Any], difficulty: dict[str, Any], root: Path) -> dict:
    """The model/data/trainer overrides shared by the pre-check and the arms: held-out tasks of
    ``difficulty`` (task seed 1, never trained on), greedy pass@1 and pass@k of k samples."""
    return {
        "trainer": {
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(root), "name": "logs", "version": ""},
            },
            "enable_progress_bar": False,
            "enable_checkpointing": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "default_root_dir": str(root),
            "limit_val_batches": math.ceil(settings["eval_prompts"] / settings["val_batch_size"]),
        },
        "model": {"init_args": model_args(settings)},
        "data": {
            "init_args": {
                "val_batch_size": settings["val_batch_size"],
                "val": {"init_args": countdown_args(difficulty, settings["eval_prompts"], 1)},
            }
        },
    }


def arm_fragment(
    settings: dict[str, Any],
    difficulty: dict[str, Any],
    root: Path,
    seed: int,
    callback: dict[str, Any] | None,
) -> dict:
    """One arm for one seed: the diagnostics (every arm) plus the arm's own callback, training
    tasks of ``difficulty`` (task seed 0; the run's seed shuffles them and seeds everything)."""
    fragment = eval_fragment(settings, difficulty, root)
    steps, batch = settings["steps"], settings["batch_size"]
    region = {"k": settings["k_region"], "p": settings["p_region"]}
    diagnostics = {"class_path": DIAGNOSTICS, "init_args": region}
    fragment["seed_everything"] = seed
    fragment["trainer"]["callbacks"] = [diagnostics] + ([callback] if callback else [])
    if steps is not None:
        fragment["trainer"]["limit_train_batches"] = steps
    fragment["model"]["init_args"].setdefault("update", {})["seed"] = seed
    data = fragment["data"]["init_args"]
    data.update({"seed": seed, "batch_size": batch, "global_batch_size": None})  # per process
    if steps is not None:
        data["train"] = {"init_args": countdown_args(difficulty, steps * batch, 0)}
    return fragment


def run_cli(subcommand: str, configs: list[str], fragment: dict, path: Path) -> dict[str, float]:
    """``lit-rlhf <subcommand> --config ... --config <fragment>`` in this process; returns the
    trainer's final logged metrics as floats."""
    write_fragment(path, fragment)
    cli = cli_in_process(subcommand, [*configs, path])
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items() if v.numel() == 1}


def eval_figures(metrics: dict[str, float], k: int) -> dict[str, float]:
    """Held-out figures of a validate / the end of a fit: greedy pass@1, pass@k, sampled
    pass@1 (NaN when not logged)."""
    names = {"pass@1": "val/pass@1", "pass@k": f"val/pass@{k}", "sampled_pass@1":
             "val/sampled_pass@1"}  # fmt: skip
    return {name: metrics.get(key, math.nan) for name, key in names.items()}


def curve_figures(metrics_csv: Path) -> dict[str, Any]:
    """Per-step curves of :data:`CURVES`, each one's end value (mean of the last
    :data:`END_STEPS` steps) and, for the masses and entropies, its change from the first
    step (where every arm of a seed still holds the same policy)."""
    rows = read_rows(metrics_csv)
    figures: dict[str, Any] = {"curves": {}}
    for name, key in CURVES.items():
        points = steps_and_values(rows, key)
        figures["curves"][name] = [[s, v] for s, v in points]
        values = [v for _, v in points]
        figures[name] = statistics.fmean(values[-END_STEPS:]) if values else math.nan
        if name.startswith(("tail_mass", "entropy")):
            figures[f"{name}_change"] = figures[name] - values[0] if values else math.nan
    return figures


def pick_difficulty(tried: list[dict[str, Any]], low: float, high: float) -> dict | None:
    """The first tried difficulty whose greedy pass@1 lies in [low, high], or None."""
    return next((d for d in tried if low <= d["pass@1"] <= high), None)


def nearest_difficulty(tried: list[dict[str, Any]], low: float, high: float) -> dict[str, Any]:
    """The tried difficulty whose pass@1 is nearest to [low, high] (``--force`` without a go)."""
    return min(tried, key=lambda d: max(low - d["pass@1"], d["pass@1"] - high, 0.0))
