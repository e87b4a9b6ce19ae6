"""The scaffolding every benchmark in ``scripts/bench/`` shares: the command line (``--smoke``,
``--json``, ``--threads``), the machine description (CPU, native bf16, torch, threads, float32
and bf16 GEMM rates at the start and at the end, the other processes' CPU share during the run),
timing helpers, child processes and the Markdown table printer.

A benchmark module defines ``add_args(parser)`` (``int_args`` for its integer options),
``SMOKE`` (the defaults ``--smoke`` sets), and ``run(opts, report)``; one that measures in fresh
processes also defines ``child(opts) -> dict`` (called with ``--child``, its dict printed as the
last line of JSON).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "lit_rlhf" / "data" / "samples"


class Report:
    """What a benchmark prints (as it goes) and what ``--json`` writes (``data``); ``ok`` False
    makes the command exit 1; ``machine`` is the machine description so far."""

    def __init__(self, machine: dict[str, Any] | None = None) -> None:
        self.machine = machine or {}
        self.lines: list[str] = []
        self.data: dict[str, Any] = {}
        self.ok = True

    def say(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            self.lines.append(line)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.say(*markdown(headers, rows))


def int_args(parser: Any, **defaults: int) -> None:
    """An ``--a-name N`` option (an int) for each ``a_name=default``."""
    for name, value in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=value)


def markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table, one string a line."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return out + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def spread(values: Sequence[float], fmt: str = ".3f", scale: float = 1.0, unit: str = "") -> str:
    """``median (min-max)`` of ``values`` times ``scale``."""
    v = [x * scale for x in values]
    return f"{statistics.median(v):{fmt}}{unit} ({min(v):{fmt}}-{max(v):{fmt}})"


def ratio(numerators: Sequence[float], denominators: Sequence[float]) -> str:
    """The median of the per-round ratios with their range: a burst of noise skews one round."""
    r = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return f"{statistics.median(r):.3f}x ({min(r):.3f}-{max(r):.3f})"


def order(items: Sequence[Any], round_index: int) -> list[Any]:
    """``items`` in order on even rounds, reversed on odd ones (A B, B A, ...): slow drifts of
    the machine hit every arm alike."""
    return list(items) if round_index % 2 == 0 else list(items)[::-1]


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Timed:
    """Wraps a callable and adds up the seconds spent in it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            with torch.profiler.record_function("bench::generate"):  # for op_profile
                return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


class StepTimer(L.Callback):
    """One row per training step: its wall seconds (``step``), each counter's growth over the
    step (e.g. a :class:`Timed`'s seconds) and each probe's value at its end."""

    def __init__(
        self,
        counters: dict[str, Callable[[], float]] | None = None,
        probes: dict[str, Callable[[Any, Any], float]] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> None:
        self.counters, self.probes = counters or {}, probes or {}
        self.on_start = on_start or (lambda index: None)  # e.g. an OpProfile's step
        self.rows: list[dict[str, float]] = []
        self.start: dict[str, float] = {}

    def on_train_batch_start(self, *args: Any) -> None:
        self.on_start(len(self.rows))
        self.start = {name: fn() for name, fn in self.counters.items()}
        self.start["step"] = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, *args: Any) -> None:
        row = {"step": time.perf_counter() - self.start["step"]}
        row |= {name: fn() - self.start[name] for name, fn in self.counters.items()}
        row |= {name: float(fn(trainer, outputs)) for name, fn in self.probes.items()}
        self.rows.append(row)

    def column(self, key: str, skip: int = 0) -> list[float]:
        return [row[key] for row in self.rows[skip:]]


def fit(module: Any, callbacks: list[Any], datamodule: Any = None, **kwargs: Any) -> L.Trainer:
    """Fit ``module`` on the CPU quietly (no logger, checkpoints, bars or summary); ``kwargs``
    go to ``L.Trainer`` (``train_dataloaders`` to ``fit``)."""
    loaders = kwargs.pop("train_dataloaders", None)
    settings: dict[str, Any] = dict(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer = L.Trainer(**(settings | kwargs), callbacks=callbacks)
    trainer.fit(module, train_dataloaders=loaders, datamodule=datamodule)
    return trainer


class ChildFailed(RuntimeError):
    """A benchmark's child process exited with an error; ``last`` is its last stderr line."""

    def __init__(self, message: str, last: str) -> None:
        super().__init__(message)
        self.last = last


def spawn(name: str, args: Sequence[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m scripts.bench NAME ARGS --child ...`` in a fresh process (its own peak
    memory, compiled code, threads) and return the JSON of its last stdout line."""
    command = [sys.executable, "-m", "scripts.bench", name, *map(str, args)]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines() or ["killed"]
        raise ChildFailed(f"{' '.join(command[3:])} failed:\n" + "\n".join(tail[-15:]), tail[-1])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
