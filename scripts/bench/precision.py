"""Time the demo under each precision, on this CPU and on an emulated CPU without native bf16
(wall time, ratio to float32 on the same kind of CPU, held-out pass@1 after training).

    python -m scripts.bench precision                  # 4 fits of the demo, about 20 min
    python -m scripts.bench precision --arms native:auto native:32-true

An arm is ``KIND:PRECISION``: ``native`` (this CPU) or ``no-bf16`` (oneDNN capped at
``AVX512_CORE``). Method and figures: docs/demo.md, "Precision: what ``auto`` picks and what it
costs".
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from scripts.bench.runner import Report
from scripts.repro import runs as _runs

KINDS = {"native": {}, "no-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
DEFAULT_ARMS = ["native:auto", "native:32-true", "no-bf16:bf16-mixed", "no-bf16:32-true"]
SMOKE = {"config": Path("configs/ppo/countdown_tiny.yaml"), "arms": ["native:32-true"],
         "out": Path("runs/bench_precision_smoke"), "max_steps": 1}  # fmt: skip


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=Path("configs/ppo/countdown_smollm2.yaml"))
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, help="KIND:PRECISION ...")
    parser.add_argument("--out", type=Path, default=Path("runs/demo_precision"))
    parser.add_argument("--max-steps", type=int, default=None, help="cap the fit (smoke runs)")


def run_arm(arm: str, opts: argparse.Namespace) -> dict[str, float | str]:
    """Fit the demo once for ``arm`` and return its wall time and results."""
    kind, precision = arm.split(":", 1)
    if kind not in KINDS:
        raise SystemExit(f"unknown CPU kind {kind!r} in arm {arm!r}: use one of {list(KINDS)}")
    name = f"{kind}-{precision}"
    fragment = _runs.run_fragment(opts.out, name, 0, _runs.base_callbacks(opts.config))
    fragment["trainer"]["precision"] = precision
    if opts.max_steps is not None:
        fragment["trainer"]["max_steps"] = opts.max_steps
    path = _runs.write_fragment(opts.out / f"{name}.yaml", fragment)
    saved = {k: os.environ.get(k) for k in KINDS[kind]}
    os.environ.update(KINDS[kind])
    try:
        seconds = _runs.run_timed(_runs.cli_command("fit", [opts.config, path]))
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.update({key: value})
    rows = _runs.read_rows(opts.out / name / "seed0" / "metrics.csv")
    return {"kind": kind, "precision": precision, "seconds": seconds,
            "pass": (_runs.series(rows, "val/pass@1") or [float("nan")])[-1],
            "reward": _runs.mean_last(_runs.series(rows, "reward/mean"), 5)}  # fmt: skip


def run(opts: argparse.Namespace, report: Report) -> None:
    """The table; the ratio is to the float32 arm of the same kind (when it ran)."""
    opts.out.mkdir(parents=True, exist_ok=True)
    results = [run_arm(arm, opts) for arm in opts.arms]
    fp32 = {r["kind"]: float(r["seconds"]) for r in results if r["precision"] == "32-true"}
    rows = []
    for r in results:
        base = fp32.get(str(r["kind"]))
        rows.append((r["kind"], r["precision"], f"{float(r['seconds']):.0f} s",
                     f"{float(r['seconds']) / base:.2f}x" if base else "-",
                     f"{float(r['pass']):.3f}", f"{float(r['reward']):.3f}"))  # fmt: skip
    report.table(["CPU kind", "precision", "fit wall time", "vs float32, same kind",
                  "val pass@1 after", "train reward, last 5"], rows)  # fmt: skip
    (opts.out / "table.md").write_text("\n".join(report.lines) + "\n")
    report.data = {"arms": results}
