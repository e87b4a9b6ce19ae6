"""Long-run soak: a tiny config trained for hundreds of rollouts with checkpoints every few steps;
resident memory and step time must stay flat. Prints the slopes and writes a CSV and a PNG.

    python scripts/repro/soak.py [--config configs/ppo/countdown_tiny.yaml] [--steps 1000]
        [--every 5] [--out runs/soak] [CLI overrides, e.g. --trainer.callbacks=[]]

The run is ``lit-rlhf fit`` of ``--config`` built through the CLI (same classes and settings),
with ``max_steps`` set, validation every epoch (one batch), a CSV logger and a
``ModelCheckpoint`` every ``--every`` optimizer steps (``save_last``), all in this process. Per
optimizer step it records the wall time from one training batch's start to the next (the
whole loop: rollout, update, logging, checkpoint writes, validation) and the process's resident
memory (``VmRSS`` of /proc/self/status: current, not peak). The slopes are least-squares fits
over the steps after the first ``--warmup`` (allocator and cache warm-up): MiB and ms per 100
steps, with the medians of the first and last fifth beside them. Run it with nothing else on
the machine: step times are wall times.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import ModelCheckpoint

ROOT = Path(__file__).resolve().parents[2]


def resident_mib() -> float:
    """Current resident set size of this process in MiB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status: the soak needs Linux")


class SoakMonitor(L.Callback):
    """Per optimizer step: seconds since the previous step's batch started, and VmRSS."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self._last: float | None = None
        self._step = 0

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        now = time.perf_counter()
        if self._last is not None and trainer.global_step > self._step:
            interval = now - self._last
            self.rows.append(
                {"step": trainer.global_step, "seconds": interval, "rss_mib": resident_mib()}
            )
        self._last, self._step = now, trainer.global_step


def slope_per_100(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs, times 100."""
    return float(np.polyfit(np.asarray(xs), np.asarray(ys), 1)[0]) * 100


def summarise(rows: list[dict[str, float]], warmup: int) -> dict[str, Any]:
    kept = [r for r in rows if r["step"] > warmup]
    if len(kept) < 10:
        raise SystemExit(f"only {len(kept)} steps after warm-up: raise --steps or lower --warmup")
    steps = [r["step"] for r in kept]
    ms = [1000 * r["seconds"] for r in kept]
    rss = [r["rss_mib"] for r in kept]
    fifth = max(1, len(kept) // 5)
    fifths = [slice(i * fifth, (i + 1) * fifth if i < 4 else len(kept)) for i in range(5)]
    return {
        "steps": len(kept),
        "rss_slope": slope_per_100(steps, rss),
        "ms_slope": slope_per_100(steps, ms),
        # medians per fifth of the run: robust to the validation and checkpoint spikes
        "rss_fifths": [statistics.median(rss[f]) for f in fifths],
        "ms_fifths": [statistics.median(ms[f]) for f in fifths],
    }


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    top.plot(steps, [r["rss_mib"] for r in rows])
    top.set_ylabel("resident MiB")
    ms = np.asarray([1000 * r["seconds"] for r in rows])
    bottom.plot(steps, ms, linewidth=0.4, alpha=0.5, label="per step")
    window = min(51, len(ms))
    rolling = [
        float(np.median(ms[max(0, i - window // 2) : i + window // 2 + 1])) for i in range(len(ms))
    ]
    bottom.plot(steps, rolling, label=f"rolling median ({window})")
    bottom.set_ylim(0, 3 * float(np.median(ms)))  # spikes above are clipped
    bottom.legend(fontsize=7)
    bottom.set_ylabel("step interval (ms)")
    bottom.set_xlabel("optimizer step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run(opts: argparse.Namespace) -> list[dict[str, float]]:
    from lit_rlhf.cli import cli_main

    out: Path = opts.out
    sys.argv = sys.argv[:1]  # the CLI reads only the arguments given here
    cli = cli_main(
        [
            "--config",
            str(opts.config),
            f"--trainer.max_steps={opts.steps}",
            "--trainer.max_epochs=-1",
            "--trainer.limit_train_batches=null",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={out}",
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
            f"--trainer.logger.save_dir={out}",
            "--trainer.logger.name=logs",
            *opts.overrides,
        ],
        run=False,
    )
    monitor = SoakMonitor()
    checkpoints = ModelCheckpoint(
        dirpath=out / "checkpoints", every_n_train_steps=opts.every, save_last=True
    )
    cli.trainer.callbacks.extend([monitor, checkpoints])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return monitor.rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs/ppo/countdown_tiny.yaml")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps (= rollouts here)")
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--warmup", type=int, default=20, help="first steps left out of the fit")
    parser.add_argument("--out", type=Path, default=Path("runs/soak"))
    parser.add_argument("--replot", type=Path, help="only summarise and plot this soak.csv")
    opts, overrides = parser.parse_known_args(argv)
    opts.overrides = overrides
    if opts.replot:
        with opts.replot.open() as f:
            rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
        plot(rows, opts.replot.with_suffix(".png"))
        report(rows, opts, f"{opts.replot} (re-read)")
        return
    if opts.steps <= opts.warmup or opts.every < 1:
        parser.error("need --steps > --warmup and --every >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    opts.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = run(opts)
    wall = time.perf_counter() - start
    with (opts.out / "soak.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "seconds", "rss_mib"])
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, opts.out / "soak.png")
    print(f"wrote {opts.out / 'soak.csv'} and soak.png")
    report(
        rows,
        opts,
        f"{opts.config}: {opts.steps} steps, checkpoint every {opts.every}, {wall:.0f} s",
    )


def report(rows: list[dict[str, float]], opts: argparse.Namespace, title: str) -> None:
    s = summarise(rows, opts.warmup)
    print(f"\n{title}")
    print("| measure | median per fifth of the run | least-squares slope per 100 steps |")
    print("|---|---|---|")
    rss = " / ".join(f"{v:.1f}" for v in s["rss_fifths"])
    ms = " / ".join(f"{v:.1f}" for v in s["ms_fifths"])
    print(f"| resident memory (MiB) | {rss} | {s['rss_slope']:+.2f} MiB |")
    print(f"| step interval (ms) | {ms} | {s['ms_slope']:+.2f} ms |")
    print(f"({s['steps']:.0f} steps after the first {opts.warmup})")


if __name__ == "__main__":
    main()
