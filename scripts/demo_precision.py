"""Time the demo under each precision, side by side in one run, on this CPU and on an emulated CPU
without native bf16; print a Markdown table (wall time, ratio to float32 on the same kind of CPU,
held-out pass@1 after training).

    python scripts/demo_precision.py                       # 4 fits of the demo, about 20 min
    python scripts/demo_precision.py --arms native:auto native:32-true

An arm is ``KIND:PRECISION``. ``native`` runs on this CPU as it is. ``no-bf16`` caps oneDNN (the
library behind torch's CPU bf16 matmuls) at AVX-512 without its bf16 instructions
(``ONEDNN_MAX_CPU_ISA=AVX512_CORE``), which emulates a CPU without AVX512-BF16 / AMX on one that
has them: bf16 matmuls then run without native support. ``auto`` resolves by this CPU's flags (it
reads /proc/cpuinfo, which the cap does not change), so for the emulated kind the table shows the
explicit precisions; what ``auto`` picks on such a CPU is tested with mocked flags
(tests/training/test_precision.py). Run it alone on the machine: the figures are wall times.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _runs import (
    base_callbacks,
    cli_command,
    mean_last,
    read_rows,
    run_fragment,
    run_timed,
    series,
    write_fragment,
)

KINDS = {"native": {}, "no-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
DEFAULT_ARMS = ["native:auto", "native:32-true", "no-bf16:bf16-mixed", "no-bf16:32-true"]


def cpu_kind() -> str:
    """This machine's CPU model and whether it has native bf16."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                  if ln.startswith("model name")), "unknown CPU")  # fmt: skip
    native = [f for f in ("avx512_bf16", "amx_bf16") if f" {f}" in text]
    return f"{model}; native bf16: {', '.join(native) or 'none'}"


def run_arm(arm: str, config: Path, out: Path) -> dict[str, float | str]:
    """Fit the demo once for ``arm`` and return its wall time and results."""
    kind, precision = arm.split(":", 1)
    if kind not in KINDS:
        raise SystemExit(f"unknown CPU kind {kind!r} in arm {arm!r}: use one of {list(KINDS)}")
    name = f"{kind}-{precision}"
    fragment = run_fragment(out, name, 0, base_callbacks(config))
    fragment["trainer"]["precision"] = precision
    path = write_fragment(out / f"{name}.yaml", fragment)
    saved = {k: os.environ.get(k) for k in KINDS[kind]}
    os.environ.update(KINDS[kind])
    try:
        seconds = run_timed(cli_command("fit", [config, path]))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    rows = read_rows(out / name / "seed0" / "metrics.csv")
    return {"kind": kind, "precision": precision, "seconds": seconds,
            "pass": series(rows, "val/pass@1")[-1],
            "reward": mean_last(series(rows, "reward/mean"), 5)}  # fmt: skip


def table(results: list[dict[str, float | str]]) -> str:
    """Markdown table; the ratio is to the float32 arm of the same kind (when it ran)."""
    fp32 = {r["kind"]: float(r["seconds"]) for r in results if r["precision"] == "32-true"}
    lines = [
        "| CPU kind | precision | fit wall time | vs float32, same kind | val pass@1 after | "
        "train reward, last 5 |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        base = fp32.get(str(r["kind"]))
        ratio = f"{float(r['seconds']) / base:.2f}x" if base else "-"
        lines.append(
            f"| {r['kind']} | {r['precision']} | {float(r['seconds']):.0f} s | {ratio} | "
            f"{float(r['pass']):.3f} | {float(r['reward']):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/ppo/countdown_smollm2.yaml"))
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, help="KIND:PRECISION ...")
    parser.add_argument("--out", type=Path, default=Path("runs/demo_precision"))
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_kind()}", flush=True)
    results = [run_arm(arm, opts.config, opts.out) for arm in opts.arms]
    report = f"CPU: {cpu_kind()}\n\n{table(results)}\n"
    (opts.out / "table.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
