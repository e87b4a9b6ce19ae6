"""The running half of the preset dry run (tests/test_preset_dry_run.py): the schedule's expected
lr, the probe that reads the optimizer before and after, the stand-in reward term, and the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from lit_rlhf.cli import cli_main


# ------------------------------------------------------------------ the schedule
def warmup_steps(args: dict[str, Any], total: int) -> int:
    if args.get("lr_warmup_ratio", 0) > 0:
        return int(args["lr_warmup_ratio"] * total)
    return int(args.get("lr_warmup_steps", 0))


def expected_lr(args: dict[str, Any], count: int, total: int) -> float:
    """The lr verl's schedules give at ``count`` (hand-written here, independent of the code)."""
    lr, warmup = float(args["lr"]), warmup_steps(args, total)
    if count < warmup:
        return lr * count / warmup
    kind = args.get("lr_schedule", "constant")
    if kind == "constant":
        return lr
    floor = lr * float(args.get("min_lr_ratio", 0.0))
    progress = min((count - warmup) / (total - warmup), 1.0)
    if kind == "linear":
        return lr + (floor - lr) * progress
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ------------------------------------------------------------------ the run
def _innermost(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer that holds the Adam state (DeepSpeed's ZeRO optimizers wrap one)."""
    inner = optimizer
    for _ in range(4):
        nested = getattr(inner, "optimizer", None)
        if not isinstance(nested, torch.optim.Optimizer):
            break
        inner = nested
    assert isinstance(inner, torch.optim.Optimizer), type(optimizer)
    return inner


def stepped_params(optimizer: Any) -> list[torch.Tensor]:
    """The tensors the optimizer steps: DeepSpeed's float32 partitions (ZeRO-3 puts its own into
    the inner optimizer's groups only during a step), else the parameters of the groups."""
    for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
        partitions = getattr(optimizer, name, None)
        if partitions:
            return list(partitions)
    return [p for group in _innermost(optimizer).param_groups for p in group["params"]]


class VariedReward(L.Callback):
    """A reward term below 0.01 that varies with the response text (sha1 of it): a random tiny
    model earns no Countdown, MATH or verdict reward, and with every reward 0 (and a value head
    that starts at 0) the update has no gradient at all, so nothing could be asserted."""

    def reward_term(self, trainer: Any, pl_module: Any, ctx: Any) -> tuple[torch.Tensor, dict]:
        digits = [int(hashlib.sha1(r.encode()).hexdigest()[:6], 16) for r in ctx.responses]
        term = torch.tensor(digits, dtype=torch.float32) / 16**6 * 0.01
        return term.to(ctx.scores.device), {}


class Probe(L.Callback):
    """Snapshots the optimizer's parameters at the start, reads ``train/lr`` after each batch.
    Snapshots and comparisons are made on the CPU (a GPU run's tensors are copied there)."""

    def __init__(self) -> None:
        self.before: list[torch.Tensor] = []
        self.lrs: list[float] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.wrapper: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.wrapper = trainer.optimizers[0]
        self.optimizer = _innermost(self.wrapper)
        self.before = [p.detach().to("cpu", copy=True) for p in stepped_params(self.wrapper)]
        assert self.before, "the optimizer holds no parameter"

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        lr = trainer.callback_metrics.get("train/lr")
        if lr is not None:
            self.lrs.append(float(lr))

    def check_state(self) -> None:
        """Float32 parameters and Adam moments; the stepped entries changed."""
        assert self.optimizer is not None
        stepped = changed = 0
        for before, param in zip(self.before, stepped_params(self.wrapper), strict=True):
            assert param.dtype == torch.float32, f"an optimizer parameter is {param.dtype}"
            state = self.optimizer.state.get(param, {})
            for key in ("exp_avg", "exp_avg_sq"):
                assert key in state, f"no Adam {key} for a trainable parameter"
                assert state[key].dtype == torch.float32, f"Adam {key} is {state[key].dtype}"
            moved = (state["exp_avg"] != 0).cpu()
            stepped += int(moved.sum())
            changed += int((param.detach().cpu() != before)[moved].sum())
        assert stepped > 0, "no parameter was stepped"
        assert changed >= 0.9 * stepped, (
            f"only {changed} of {stepped} stepped entries changed: the update was lost "
            "(a 16-bit weight without float32 master copy?)"
        )


def dry_run(config: dict[str, Any], root: Path) -> tuple[Any, Probe]:
    """``Trainer.fit`` of ``config`` in this process (written to ``root``), with
    :class:`VariedReward` and a :class:`Probe`; the engine is closed and a process group ended."""
    path = root / "dry_run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    # a distributed run sets MASTER_PORT & co. in this process's environment; left there, every
    # later test's subprocess would inherit the port this process's store still listens on
    environment = dict(os.environ)
    cli = cli_main(["--config", str(path)], run=False)  # run=False: no subcommand
    probe = Probe()
    cli.trainer.callbacks.extend([VariedReward(), probe])
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    finally:
        close = getattr(cli.model, "close", None)
        if callable(close):
            close()
        end_process_group()
        os.environ.clear()
        os.environ.update(environment)
    return cli, probe


def end_process_group() -> None:
    """Destroy the one-process group of an in-process DeepSpeed run, through DeepSpeed when it
    made it (it caches groups; a later run would meet the destroyed ones)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    ds_comm = sys.modules.get("deepspeed.comm.comm")
    if ds_comm is not None and getattr(ds_comm, "cdb", None) is not None:
        ds_comm.destroy_process_group()
    else:
        torch.distributed.destroy_process_group()


def check_lr(args: dict[str, Any], probe: Probe, batches: int) -> None:
    """``args``: the module's ``optim`` group. ``train/lr`` after each batch is what the
    schedule gives there (lr_interval: batch), or
    within warmup / decay bounds (optimizer_step: the logged value spans the batch's steps)."""
    assert len(probe.lrs) == batches, f"train/lr logged after {len(probe.lrs)} of {batches} batches"
    total = args.get("lr_total_steps") or batches
    lr = float(args["lr"])
    if args.get("lr_interval", "batch") == "batch":
        for count, logged in enumerate(probe.lrs):
            assert math.isclose(logged, expected_lr(args, count, total), rel_tol=1e-5, abs_tol=0)
    else:
        assert all(0 <= x <= lr * (1 + 1e-6) for x in probe.lrs), probe.lrs
    if warmup_steps(args, total) > 0:
        assert probe.lrs[0] < lr, "a warmup must start below the configured lr"


def compose(preset: Path, fragment: str | None) -> dict[str, Any]:
    """The config as LightningCLI composes it from the files (defaults filled in)."""
    args = ["fit", "--config", str(preset)]
    if fragment is not None:
        args += ["--config", str(Path(__file__).resolve().parents[1] / fragment)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        cli_main([*args, "--print_config"])
    assert exit_info.value.code == 0, out.getvalue()[-2000:]
    # importing deepspeed may print its accelerator notice ("[<time>] [WARNING] ...") first
    text = "\n".join(x for x in out.getvalue().splitlines() if not x.startswith("["))
    return yaml.safe_load(text)


def vllm_old_log_probs(config: dict[str, Any]) -> list[str]:
    """A vLLM preset that takes several optimizer steps per rollout must recompute the old
    log-probs with the trainer (as verl does): vLLM's are not the trainer's numerics."""
    args = config["model"]["init_args"]
    engine = str((args.get("engine") or {}).get("class_path", ""))
    update = args.get("update") or {}
    data = config["data"]["init_args"]
    batch = data.get("global_batch_size") or data.get("batch_size") or 1  # prompts
    g = (args.get("rollout") or {}).get("samples_per_prompt") or 1
    rollout = batch * g
    global_mini = update.get("global_mini_batch_size")  # prompts, as the global batch
    mini = global_mini * g if global_mini else update.get("mini_batch_size") or rollout
    steps = (update.get("ppo_epochs") or 1) * math.ceil(rollout / mini)
    if not engine.endswith("VLLMGenerationEngine"):
        return []
    problems = []
    if (args.get("mismatch") or {}).get("correction", "auto") == "auto":
        problems.append(
            "a vLLM preset pins model.init_args.mismatch.correction (none: the authors' update; "
            "the default auto turns truncated importance sampling on with vLLM)"
        )
    if steps > 1 and update.get("recompute_old_log_probs") is not True:
        problems.append(
            f"{steps} optimizer steps per rollout with vLLM: set model.init_args.update."
            "recompute_old_log_probs: true (the ratio's denominator from the trainer, as verl)"
        )
    return problems
