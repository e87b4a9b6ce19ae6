"""Run the demo over several seeds and report reward before/after as a Markdown table.

For each seed: ``lit-rlhf validate`` on the untrained model (greedy pass@1 on the held-out tasks),
then ``lit-rlhf fit`` (which validates again at the end), then read both CSV logs.

    python scripts/repro/demo_seeds.py --seeds 0 1 2 [--config configs/ppo/countdown_smollm2.yaml]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/
from repro.runs import (
    base_callbacks,
    cli_command,
    mean_first,
    mean_last,
    read_rows,
    run_fragment,
    run_timed,
    series,
    write_fragment,
)


def _override(out: Path, seed: int, name: str, config: Path) -> Path:
    """A config fragment: one CSV logger under ``out``, keeping the base config's callbacks."""
    fragment = run_fragment(out, name, seed, base_callbacks(config))
    return write_fragment(out / f"{name}-seed{seed}.yaml", fragment)


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
        run_timed(cli_command("validate", [opts.config, pre]))
        post = _override(opts.out, seed, "fit", opts.config)
        seconds = run_timed(cli_command("fit", [opts.config, post]))
        pre_rows = read_rows(opts.out / "before" / f"seed{seed}" / "metrics.csv")
        before = series(pre_rows, "val/pass@1")
        fit = read_rows(opts.out / "fit" / f"seed{seed}" / "metrics.csv")
        reward, correct = series(fit, "reward/mean"), series(fit, "reward/correct")
        after = series(fit, "val/pass@1")
        w = opts.window
        lines.append(
            f"| {seed} | {before[-1]:.3f} | {after[-1]:.3f} | {mean_first(reward, w):.3f} / "
            f"{mean_last(reward, w):.3f} | {mean_first(correct, w):.3f} / "
            f"{mean_last(correct, w):.3f} | {seconds:.0f} s |"
        )
        print("\n".join(lines), flush=True)
    (opts.out / "results.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {opts.out / 'results.md'}")


if __name__ == "__main__":
    main()
