"""Helpers shared by the reproductions (``scripts/repro/``) and ``scripts/bench/precision.py``:
write a LightningCLI config fragment, run ``lit-rlhf`` in a subprocess (timed) or in this
process, read series from a CSVLogger's ``metrics.csv``. Imported as ``repro.runs`` (``scripts/`` on
``sys.path``) or ``scripts.repro.runs``; it imports nothing else from ``repro``.
"""

from __future__ import annotations

import csv
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

    ``seed_model`` also sets ``model.init_args.update.seed`` (the PPO mini-batch shuffling seed).
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
        fragment["model"] = {"init_args": {"update": {"seed": seed}}}
    return fragment


def write_fragment(path: Path, fragment: dict[str, Any]) -> Path:
    """Write ``fragment`` as YAML to ``path`` (creating its folder); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(fragment))
    return path


def sft_export(
    rows: Sequence[dict[str, str]], root: Path, s: dict[str, Any] | Any, *, in_process: bool,
    export_name: str = "warm-judge", data_name: str = "warm-start",
) -> tuple[Path, float]:  # fmt: skip
    """``SFTModule`` (the config ``s["sft_config"]``) fine-tuned on ``rows`` (``prompt`` ->
    ``response``; settings ``model``, ``sft_steps``, ``sft_lr``, ``sft_batch_size``, optional
    ``max_length`` and ``accelerator``), exported to ``root/export_name`` (a HF folder, reused
    when there; the rows and config go to ``root/data_name.jsonl`` / ``.yaml``). Returns (folder,
    seconds spent now: 0 when reused)."""
    import json

    export = root / export_name
    if (export / "config.json").exists():
        return export, 0.0
    data = root / f"{data_name}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fragment = {
        "seed_everything": 0,
        "trainer": {"max_steps": s["sft_steps"], "max_epochs": -1, "logger": False,
                    "enable_checkpointing": False, "enable_progress_bar": False,
                    "accelerator": s.get("accelerator", "cpu")},
        "model": {"init_args": {"export_dir": str(export), "optim": {"lr": s["sft_lr"]},
                                "model": s["model"]}},
        "data": {"init_args": {"tokenizer": s["model"], "train": str(data), "val": None,
                               "train_split": "train", "prompt_field": "prompt",
                               "response_field": "response",
                               "max_length": s.get("max_length", 384),
                               "batch_size": s["sft_batch_size"]}},
    }  # fmt: skip
    config = write_fragment(data.with_suffix(".yaml"), fragment)
    start = time.perf_counter()
    if in_process:
        cli_in_process("fit", [Path(s["sft_config"]), config])
    else:
        run_timed(cli_command("fit", [Path(s["sft_config"]), config]))
    if not (export / "config.json").exists():
        raise RuntimeError(f"the SFT run wrote no HF folder at {export}")
    return export, time.perf_counter() - start


def window_parser(doc: str, regimes: Sequence[str], work: Path, out: Path) -> Any:
    """The arguments of a GPU window script (``scripts/gpu_paper.sh`` passes ``--work`` and
    ``--out``): ``--regime`` (gpu, or smoke on the CPU), ``--work``, ``--out`` and
    ``--budget-s`` (no seed or batch starts once the time spent plus the last one's exceeds it)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(regimes), default="gpu")
    parser.add_argument("--work", type=Path, default=work, help="the SFT export and pools")
    parser.add_argument("--out", type=Path, default=out, help="the JSON record")
    parser.add_argument("--budget-s", type=float, default=400.0, help="no new seed or batch after")
    return parser


def cli_command(subcommand: str, configs: Sequence[Path | str]) -> list[str]:
    """``python -m lit_rlhf.cli <subcommand> --config c1 --config c2 ...`` as an argv list."""
    return [sys.executable, "-m", "lit_rlhf.cli", subcommand,
            *(a for c in configs for a in ("--config", str(c)))]  # fmt: skip


def cli_in_process(subcommand: str, configs: Sequence[Path | str]) -> Any:
    """``lit-rlhf <subcommand> --config c1 ...`` in this process (no fresh interpreter's imports
    per run); the module's ``close`` (an engine's workers) is called after. Returns the CLI."""
    from lit_rlhf.cli import cli_main

    cli = cli_main(cli_command(subcommand, configs)[3:])
    close = getattr(cli.model, "close", None)
    if callable(close):
        close()
    return cli


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
