"""Multi-domain RL, four ways, with one command (the comparison of MGS, arXiv 2602.02301, at the
scale this machine allows): mixed RL (no surgery), global PCGrad, MGS (PCGrad per parameter group,
at the base config's granularity) and sequential RL (one domain after another, by step ranges).

Each (arm, seed) is one ``python -m lit_rlhf.cli fit`` run of the base config (and the preset's
trainer fragment) plus a fragment; the per-domain training rewards (``reward/<domain>/score``,
logged by ``RewardByTask``) and held-out validation rewards (``val/reward/<domain>``) are read
back from the runs' ``metrics.csv``. Writes ``<out>/results.md`` (per arm and domain: mean ± std
over seeds of the last ``--last`` steps' training reward, and of the last validation) and
``<out>/curves.png`` (per-domain reward curves, one panel per domain).

    python scripts/compare_multidomain.py --preset cpu --seeds 0 1 2   # tiny model, ~4 min
    python scripts/compare_multidomain.py --preset gpu --seeds 0 1 2   # the authors' recipe

The ``gpu`` preset is ``configs/ppo/multidomain_mgs_qwen2.5-7b.yaml`` (Qwen2.5-7B, every setting
of the authors, docs/recipes.md) under ``configs/trainer/deepspeed_zero2.yaml``; its MGS arm
keeps the preset's granularity (``tensor``, the authors' code) and every arm validates on
MATH-500, WildChat-IF val and IFEval.

The ``cpu`` preset trains the random tiny Llama of ``configs/ppo/multidomain_tiny.yaml`` for
``--steps`` steps: it checks that the four arms run and log, it cannot show MGS's gains (the
paper's are on 7-8B models).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _runs import (
    base_callbacks,
    cli_command,
    mean_last,
    mean_spread,
    plot_arms,
    read_rows,
    run_fragment,
    run_timed,
    series,
    write_fragment,
)

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"config": Path("configs/ppo/multidomain_tiny.yaml"), "fragment": None, "steps": 12},
    "gpu": {
        "config": Path("configs/ppo/multidomain_mgs_qwen2.5-7b.yaml"),
        "fragment": Path("configs/trainer/deepspeed_zero2.yaml"),
        "steps": None,
    },
}
ARMS = ("mixed", "pcgrad", "mgs", "sequential")
DOMAINS = ("math", "chat", "ifeval")
_MGS = "lit_rlhf.callbacks.ModularGradientSurgery"


def arm_fragment(arm: str, base: Path, out: Path, seed: int, steps: int | None) -> dict:
    """The fragment of one (arm, seed) run on top of the base config."""
    callbacks = [c for c in base_callbacks(base) if c.get("class_path") != _MGS]
    if arm in ("pcgrad", "mgs"):
        granularity = "global" if arm == "pcgrad" else base_granularity(base)
        callbacks.append({"class_path": _MGS, "init_args": {"granularity": granularity,
                                                           "seed": seed}})  # fmt: skip
    fragment = run_fragment(out, arm, seed, callbacks, seed_model=True)
    if arm == "sequential":
        fragment["data"]["init_args"].update(
            shuffle=False, train={"init_args": {"schedule": "sequential"}}
        )
    if steps:
        fragment["trainer"].update(limit_train_batches=steps, max_epochs=1)
    return fragment


def base_granularity(base: Path) -> str:
    """The MGS arm's granularity: the base config's callback's, else ``module``."""
    for callback in base_callbacks(base):
        if callback.get("class_path") == _MGS:
            return str((callback.get("init_args") or {}).get("granularity", "module"))
    return "module"


def run_all(opts: argparse.Namespace) -> dict[str, list[Path]]:
    base: Path = opts.config or PRESETS[opts.preset]["config"]
    trainer_fragment: Path | None = PRESETS[opts.preset]["fragment"]
    steps = opts.steps or PRESETS[opts.preset]["steps"]
    csvs: dict[str, list[Path]] = {arm: [] for arm in opts.arms}
    for arm in opts.arms:
        for seed in opts.seeds:
            fragment = write_fragment(
                opts.out / f"{arm}-seed{seed}.yaml", arm_fragment(arm, base, opts.out, seed, steps)
            )
            configs = [base, *([trainer_fragment] if trainer_fragment else []), fragment]
            command = cli_command("fit", configs)
            print(f"{arm} seed {seed}: {' '.join(command)}", flush=True)
            if not opts.dry_run:
                print(f"  {run_timed(command):.0f} s", flush=True)
            csvs[arm].append(opts.out / arm / f"seed{seed}" / "metrics.csv")
    return csvs


def summarise(csvs: dict[str, list[Path]], last: int, key: str = "reward/{domain}/score") -> str:
    """Per arm and domain, mean ± std over seeds of the mean of the last ``last`` values of
    ``key`` (training: ``reward/<domain>/score``; held-out: ``val/reward/<domain>``, last=1)."""
    lines = ["| arm | " + " | ".join(DOMAINS) + " |", "|---|" + "---|" * len(DOMAINS)]
    for arm, paths in csvs.items():
        cells = []
        for domain in DOMAINS:
            values = [
                mean_last(xs, last)
                for p in paths
                if p.exists() and (xs := series(read_rows(p), key.format(domain=domain)))
            ]
            cells.append(mean_spread(values))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


SURGERY_KEYS = ("conflict_fraction", "cosine_mean", "cosine_min")


def surgery_table(csvs: dict[str, list[Path]]) -> str:
    """Per arm with surgery: the mean over all steps of the callback's statistics (fraction of
    (group, domain pair) cosines below 0, mean and minimum cosine), mean ± std over seeds. At
    ``global`` granularity a group is the whole flattened gradient; at ``module`` one attention
    or MLP block (or one other tensor)."""
    lines = ["| arm | " + " | ".join(SURGERY_KEYS) + " |", "|---|" + "---|" * len(SURGERY_KEYS)]
    for arm, paths in csvs.items():
        if arm not in ("pcgrad", "mgs"):
            continue
        cells = []
        for key in SURGERY_KEYS:
            values = [
                sum(xs) / len(xs)
                for p in paths
                if p.exists() and (xs := series(read_rows(p), f"ModularGradientSurgery/{key}"))
            ]
            cells.append(mean_spread(values))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def plot(csvs: dict[str, list[Path]], path: Path) -> None:
    keys = [f"reward/{domain}/score" for domain in DOMAINS]
    plot_arms(csvs, keys, path, step_key="rollout/step", xlabel="rollout step", legend_size=7)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="cpu")
    parser.add_argument("--config", type=Path, help="override the preset's base config")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, help="training steps per run (default: preset's)")
    parser.add_argument("--last", type=int, default=4, help="steps averaged in the table")
    parser.add_argument("--out", type=Path, default=Path("runs/compare_multidomain"))
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    opts = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    csvs = run_all(opts)
    if opts.dry_run:
        return
    table = summarise(csvs, opts.last)
    held_out = summarise(csvs, 1, key="val/reward/{domain}")
    if held_out.count("n/a") < len(csvs) * len(DOMAINS):  # some arm validated
        table += "\n\nHeld-out validation reward (the last validation):\n\n" + held_out
    surgery = surgery_table(csvs)
    if surgery:
        table += "\n\nGradient conflicts seen by the surgery (mean over steps):\n\n" + surgery
    (opts.out / "results.md").write_text(table + "\n")
    plot(csvs, opts.out / "curves.png")
    print(table)


if __name__ == "__main__":
    main()
