"""Run the demo over several seeds and report reward before/after as a Markdown table.

For each seed: ``lit-rlhf validate`` on the untrained model (greedy pass@1 on the held-out tasks),
then ``lit-rlhf fit`` (which validates again at the end), then read both CSV logs.

    python scripts/demo_seeds.py --seeds 0 1 2 [--config configs/ppo/countdown_smollm2.yaml]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

import yaml


def _override(out: Path, seed: int, name: str, config: Path) -> Path:
    """A config fragment: one CSV logger under ``out``, keeping the base config's callbacks."""
    base = yaml.safe_load(config.read_text())
    fragment = {
        "seed_everything": seed,
        "trainer": {
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(out), "name": name, "version": f"seed{seed}"},
            },
            "callbacks": base.get("trainer", {}).get("callbacks", []),
            "enable_progress_bar": False,
        },
        "data": {"init_args": {"seed": seed}},
    }
    path = out / f"{name}-seed{seed}.yaml"
    path.write_text(yaml.safe_dump(fragment))
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _series(rows: list[dict[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) not in (None, "")]


def _run(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lit_rlhf.cli", *args], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/ppo/countdown_smollm2.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/demo_seeds"))
    parser.add_argument("--window", type=int, default=5, help="steps averaged at start and end")
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    lines = [
        "| seed | val pass@1 before | val pass@1 after | train reward, first/last "
        f"{opts.window} steps | train correct, first/last {opts.window} | fit wall time |",
        "|---|---|---|---|---|---|",
    ]
    for seed in opts.seeds:
        pre = _override(opts.out, seed, "before", opts.config)
        _run(["validate", "--config", str(opts.config), "--config", str(pre)])
        post = _override(opts.out, seed, "fit", opts.config)
        seconds = _run(["fit", "--config", str(opts.config), "--config", str(post)])
        before = _series(_rows(opts.out / "before" / f"seed{seed}" / "metrics.csv"), "val/pass@1")
        fit = _rows(opts.out / "fit" / f"seed{seed}" / "metrics.csv")
        reward, correct = _series(fit, "reward/mean"), _series(fit, "reward/correct")
        after = _series(fit, "val/pass@1")
        w = opts.window

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs)

        lines.append(
            f"| {seed} | {before[-1]:.3f} | {after[-1]:.3f} | {mean(reward[:w]):.3f} / "
            f"{mean(reward[-w:]):.3f} | {mean(correct[:w]):.3f} / {mean(correct[-w:]):.3f} | "
            f"{seconds:.0f} s |"
        )
        print("\n".join(lines), flush=True)
    (opts.out / "results.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {opts.out / 'results.md'}")


if __name__ == "__main__":
    main()
