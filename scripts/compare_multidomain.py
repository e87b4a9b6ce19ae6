"""Multi-domain RL, four ways, with one command (the comparison of MGS, arXiv 2602.02301, at the
scale this machine allows): mixed RL (no surgery), global PCGrad, MGS (PCGrad per attention / MLP
module) and sequential RL (one domain after another, by step ranges).

Each (arm, seed) is one ``python -m lit_rlhf.cli fit`` run of the base config plus a fragment;
the per-domain training rewards (``reward/<domain>/score``, logged by ``RewardByTask``) are read
back from the runs' ``metrics.csv``. Writes ``<out>/results.md`` (per arm and domain: mean ± std
over seeds of the last ``--last`` steps' reward) and ``<out>/curves.png`` (per-domain reward
curves, one panel per domain).

    python scripts/compare_multidomain.py --preset cpu --seeds 0 1 2   # tiny model, ~4 min
    python scripts/compare_multidomain.py --preset gpu --seeds 0 1 2   # the authors' recipe (DDP)

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
    "cpu": {"config": Path("configs/ppo/multidomain_tiny.yaml"), "steps": 12},
    "gpu": {"config": Path("configs/ppo/multidomain_mgs_qwen2.5-1.5b.yaml"), "steps": None},
}
ARMS = ("mixed", "pcgrad", "mgs", "sequential")
DOMAINS = ("math", "chat", "ifeval")
_MGS = "lit_rlhf.callbacks.ModularGradientSurgery"


def arm_fragment(arm: str, base: Path, out: Path, seed: int, steps: int | None) -> dict:
    """The fragment of one (arm, seed) run on top of the base config."""
    callbacks = [c for c in base_callbacks(base) if c.get("class_path") != _MGS]
    if arm in ("pcgrad", "mgs"):
        granularity = "global" if arm == "pcgrad" else "module"
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


def run_all(opts: argparse.Namespace) -> dict[str, list[Path]]:
    base: Path = opts.config or PRESETS[opts.preset]["config"]
    steps = opts.steps or PRESETS[opts.preset]["steps"]
    csvs: dict[str, list[Path]] = {arm: [] for arm in opts.arms}
    for arm in opts.arms:
        for seed in opts.seeds:
            fragment = write_fragment(
                opts.out / f"{arm}-seed{seed}.yaml", arm_fragment(arm, base, opts.out, seed, steps)
            )
            command = cli_command("fit", [base, fragment])
            print(f"{arm} seed {seed}: {' '.join(command)}", flush=True)
            if not opts.dry_run:
                print(f"  {run_timed(command):.0f} s", flush=True)
            csvs[arm].append(opts.out / arm / f"seed{seed}" / "metrics.csv")
    return csvs


def summarise(csvs: dict[str, list[Path]], last: int) -> str:
    lines = ["| arm | " + " | ".join(DOMAINS) + " |", "|---|" + "---|" * len(DOMAINS)]
    for arm, paths in csvs.items():
        cells = []
        for domain in DOMAINS:
            values = [
                mean_last(xs, last)
                for p in paths
                if p.exists() and (xs := series(read_rows(p), f"reward/{domain}/score"))
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
    surgery = surgery_table(csvs)
    if surgery:
        table += "\n\nGradient conflicts seen by the surgery (mean over steps):\n\n" + surgery
    (opts.out / "results.md").write_text(table + "\n")
    plot(csvs, opts.out / "curves.png")
    print(table)


if __name__ == "__main__":
    main()
