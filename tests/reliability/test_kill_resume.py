"""Kill and resume: every module's tiny config trains with checkpoints every 2 steps, a second run
of the same command is killed with SIGKILL mid-epoch, and the run resumed from its last.ckpt
logs, at every step after the resume point, exactly what the uninterrupted run logged.

Exact equality holds on CPU because every source of randomness and every position is in the
checkpoint: the global generators (``GlobalRNGState``; the engines sample from torch's), the
modules' own generators (mini-batch shuffling, ConsistRM's tie-breaks), the loader position
(``EpochEndLoaderReset`` and the data module's ``epoch_to_train`` when a checkpoint falls on an
epoch's last batch), callback and reward state (a routed ScalarRMReward's running mean); and
every run computes with one thread in the same order. Only wall-clock timings (``*_seconds``)
are left out of the comparison. Without these the sampling cases differ from the first resumed
step on (other responses, rewards, gradients), and the epoch-end cases train on another epoch's
prompts or skip an epoch.

Each run is a separate process forked from a server that has imported the library once
(``tests/reliability/run_training.py``); the killed one is killed with a real SIGKILL.
"""

from __future__ import annotations

import csv
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
STEPS = 5  # optimizer steps per run; checkpoints at 2 and 4


@dataclass(frozen=True)
class Case:
    config: str
    # more command-line arguments; ``{root}`` stands for the run's folder
    overrides: tuple[str, ...] = ()


# the random policy never writes a Countdown answer (reward 0, no update): a digit reward makes
# every step change the weights and the optimizer state
DIGITS = (
    "--model.init_args.reward=lit_rlhf.rewards.DigitFractionReward",
    "--model.init_args.eval.pass_metric=null",
)
COUNTDOWN = "configs/ppo/countdown_tiny.yaml"

CASES = {
    "ppo": Case(COUNTDOWN, DIGITS),
    # a validation right after every checkpoint, sampling from the global generator
    "ppo-sampled-val": Case(
        COUNTDOWN,
        (*DIGITS, "--model.init_args.eval.greedy=false", "--trainer.val_check_interval=2"),
    ),
    # epochs of 2 batches, so every checkpoint falls on an epoch's last batch: the loader's order
    # spent (8 prompts), or cut short by limit_train_batches
    "ppo-epoch-end": Case(
        COUNTDOWN,
        (
            *DIGITS,
            "--trainer.max_epochs=3",
            "--data.init_args.train.init_args.num_examples=8",
            "--trainer.limit_train_batches=1.0",
        ),
    ),
    "ppo-epoch-cut-short": Case(
        COUNTDOWN, (*DIGITS, "--trainer.max_epochs=3", "--trainer.limit_train_batches=2")
    ),
    "ppo-multidomain-mgs": Case("configs/ppo/multidomain_tiny.yaml"),
    # the random judge earns no reward here (no update): this case checks the sampling
    "grm-rft": Case("configs/grm/rft_tiny.yaml"),
    "grm-consistrm": Case("configs/grm/consistrm_tiny.yaml"),
    "rm-bt": Case("configs/rm/bt_tiny.yaml", ("--model.init_args.export_dir={root}/hf",)),
    "sft": Case("configs/sft/tiny.yaml", ("--model.init_args.export_dir={root}/hf",)),
    "compressor": Case("configs/compressor/tiny.yaml", (f"--trainer.val_check_interval={STEPS}",)),
}


@pytest.fixture(scope="module")
def forked() -> Iterator[multiprocessing.context.ForkServerContext]:
    """A fork server with the library imported (``sys.path`` holds the repository root while
    it starts, so that it imports ``tests.reliability.run_training``). Python keeps one fork
    server per process: one started earlier by other code would lack the preload."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.reliability.run_training"])
    sys.path.insert(0, str(REPO))
    try:
        from multiprocessing import forkserver

        forkserver.ensure_running()
    finally:
        sys.path.remove(str(REPO))
    yield context


def start(context: Any, argv: list[str], log: Path) -> Any:
    from tests.reliability.run_training import fit

    process = context.Process(target=fit, args=(argv, str(REPO), str(log)))
    process.start()
    return process


def finish(process: Any, log: Path, timeout: float = 120) -> None:
    process.join(timeout)
    if process.exitcode != 0:
        process.kill()
        tail = log.read_text()[-4000:] if log.exists() else ""
        pytest.fail(f"training run exited with {process.exitcode}:\n{tail}")


def fit_args(case: Case, root: Path, version: str, *, only_ours: bool = False) -> list[str]:
    """The run's command line: the config, a CSV log ``root/logs/*/<version>``, checkpoints
    every 2 steps into ``root/ckpt`` (a copy as last.ckpt), ``STEPS`` steps in one epoch (unless
    the case's arguments, last, say otherwise); ``only_ours``: without the config's callbacks
    (its PeriodicCheckpoint would write at the same steps)."""
    return [
        f"--config={case.config}",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root / 'logs'}",
        f"--trainer.logger.init_args.version={version}",
        *(["--trainer.callbacks=[]"] if only_ours else []),  # without the config's checkpoints
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        f"--trainer.callbacks.dirpath={root / 'ckpt'}",
        "--trainer.callbacks.every_n_train_steps=2",
        "--trainer.callbacks.save_top_k=-1",
        "--trainer.callbacks.save_last=true",
        f"--trainer.max_steps={STEPS}",
        f"--trainer.limit_train_batches={STEPS}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *(arg.format(root=root) for arg in case.overrides),
    ]


def step_metrics(root: Path, version: str) -> dict[int, dict[str, float]]:
    """``step -> {metric: value}`` from the run's metrics.csv (rows of one step merged)."""
    (path,) = (root / "logs").glob(f"*/{version}/metrics.csv")
    steps: dict[int, dict[str, float]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            values = {k: float(v) for k, v in row.items() if k != "step" and v not in ("", None)}
            steps.setdefault(int(row["step"]), {}).update(values)
    return steps


def same(key: str, a: float, b: float) -> bool:
    """Equal (NaN equals NaN: a domain absent from a step); wall-clock timings (``*_seconds``,
    e.g. ``CritiqueConsistencyReward/embed_seconds``, and the update's ``perf/`` rates) are not
    training state and may differ."""
    timing = key.endswith("_seconds") or key.startswith("perf/")
    return a == b or (math.isnan(a) and math.isnan(b)) or timing


def kill_after_first_checkpoint(context: Any, argv: list[str], ckpt: Path, log: Path) -> None:
    """Start the run (slowed to 0.25 s per step) and SIGKILL it as soon as last.ckpt exists,
    i.e. after the step-2 checkpoint and before the run ends."""
    argv = [*argv, "--trainer.callbacks+=tests.reliability.run_training.PauseBeforeStep"]
    process = start(context, argv, log)
    deadline = time.monotonic() + 120
    while not (ckpt / "last.ckpt").exists():
        if not process.is_alive() or time.monotonic() > deadline:
            finish(process, log, timeout=1)
            pytest.fail("the run ended before it wrote a checkpoint")
        time.sleep(0.02)
    assert process.is_alive(), "the run had already ended: nothing was interrupted"
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    assert process.exitcode == -signal.SIGKILL


def kill_and_resume(context: Any, case: Case, broken: Path) -> int:
    """Kill a run after its first checkpoint, check what it left, resume it from last.ckpt to
    the end; returns the step it resumed at."""
    kill_after_first_checkpoint(
        context, fit_args(case, broken, "killed"), broken / "ckpt", broken.with_suffix(".log")
    )
    # every checkpoint the kill left behind is complete (a write cut short never takes a
    # checkpoint's name), and last.ckpt is one from inside the run
    for path in sorted((broken / "ckpt").glob("*.ckpt")):
        torch.load(path, map_location="cpu", weights_only=True)
    last = torch.load(broken / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert 2 <= last["global_step"] < STEPS
    log = broken.with_suffix(".resumed.log")
    argv = [*fit_args(case, broken, "resumed"), f"--ckpt_path={broken / 'ckpt' / 'last.ckpt'}"]
    finish(start(context, argv, log), log)
    return int(last["global_step"])


@pytest.mark.parametrize("name", list(CASES))
def test_kill_mid_epoch_and_resume_logs_what_the_uninterrupted_run_logs(
    forked: Any, tiny_model_dir: str, tmp_path: Path, name: str
) -> None:
    case = CASES[name]
    full, broken = tmp_path / "full", tmp_path / "broken"
    reference = start(forked, fit_args(case, full, "full"), full.with_suffix(".log"))
    try:
        resumed_at = kill_and_resume(forked, case, broken)
        finish(reference, full.with_suffix(".log"))
    finally:
        if reference.is_alive():  # a failure above: no run outlives the test
            reference.kill()

    expected, got = step_metrics(full, "full"), step_metrics(broken, "resumed")
    # the resumed run logs from the step after its checkpoint to the end, nothing before
    assert sorted(got) == [s for s in sorted(expected) if s >= resumed_at]
    assert len(got) >= 1
    for step, metrics in got.items():
        assert metrics.keys() == expected[step].keys(), step
        want = expected[step]
        differ = {k: (want[k], v) for k, v in metrics.items() if not same(k, want[k], v)}
        assert not differ, f"step {step}: (uninterrupted, resumed) {differ}"


@pytest.mark.parametrize(
    ("write", "complete", "partial"),
    [
        (1, ["epoch=0-step=2.ckpt", "last.ckpt"], "epoch=0-step=4.ckpt"),
        (2, ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"], "last.ckpt"),
    ],
    ids=["step-file", "last-ckpt"],
)
def test_kill_while_writing_a_checkpoint_leaves_last_ckpt_whole(
    forked: Any,
    tiny_model_dir: str,
    tmp_path: Path,
    write: int,
    complete: list[str],
    partial: str,
) -> None:
    """The run is killed halfway through writing a step-4 checkpoint file (its own or the new
    last.ckpt): the half-written bytes never take a checkpoint's name, last.ckpt still is the
    whole step-2 checkpoint, and the run resumes from it."""
    argv = [
        *fit_args(CASES["rm-bt"], tmp_path, "killed", only_ours=True),  # its writes counted
        "--trainer.callbacks+=tests.reliability.run_training.KillWhileWritingCheckpoint",
        "--trainer.callbacks.at_step=4",
        f"--trainer.callbacks.write={write}",
    ]
    log = tmp_path / "killed.log"
    process = start(forked, argv, log)
    process.join(120)
    assert process.exitcode == -signal.SIGKILL, log.read_text()[-4000:]

    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.glob("*.ckpt")) == complete
    steps = {p.name: torch.load(p, weights_only=True)["global_step"] for p in ckpt.glob("*.ckpt")}
    assert steps["last.ckpt"] == 2
    # the kill did land mid-write: half a checkpoint, under a hidden temporary name only
    (cut,) = ckpt.glob(f".{partial}.*.tmp")
    assert 0 < cut.stat().st_size < (ckpt / "epoch=0-step=2.ckpt").stat().st_size
    with pytest.raises(Exception):  # noqa: B017 (torch raises RuntimeError or UnpicklingError)
        torch.load(cut, weights_only=True)

    log = tmp_path / "resumed.log"
    argv = [*fit_args(CASES["rm-bt"], tmp_path, "resumed"), f"--ckpt_path={ckpt / 'last.ckpt'}"]
    finish(start(forked, argv, log), log)
    assert torch.load(ckpt / "last.ckpt", weights_only=True)["global_step"] == 4
    assert not list(ckpt.glob(".*.tmp"))  # rewriting the name removed the cut-short write
