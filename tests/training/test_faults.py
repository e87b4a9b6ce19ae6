"""Faults that must not end a run (``lit_rlhf.training.faults``), on a plain LightningModule
written here: a non-finite loss or gradient skips the optimizer step (weights and AdamW state
untouched), is counted in ``fault/skipped_steps`` and training goes on; ``max_consecutive_skips``
in a row stop the run with a FloatingPointError; SIGTERM / Ctrl-C leave a resumable checkpoint
and exit with 128 + the signal (in-process, and ``lit-rlhf fit`` in a subprocess)."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import DigitFractionReward
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.training import NonFiniteSkips, OptimizerStep
from lit_rlhf.training.faults import SKIPPED_STEPS_KEY, CheckpointOnInterrupt
from tests.distributed.launch import fit_and_sigterm, interrupted_step, resume_one_more_step
from tests.helpers import prompt_loader, quiet_trainer

NAN = float("nan")


@dataclass
class Record:
    kind: str | None  # the fault injected in this training step (None: none)
    before: dict[str, Tensor]  # weights and AdamW state before the step
    after: dict[str, Tensor]
    stats: dict[str, float]


class NaNRegression(L.LightningModule):
    """Least squares through ``OptimizerStep`` (AdamW, clipping, two micro-batches) whose
    training step ``i`` fails as ``faults[i]`` says, on rank ``fault_rank`` (None: every rank):
    ``loss`` (a NaN loss), ``grad`` (a finite loss, a NaN gradient from a tensor hook),
    ``detached`` (the loss plus a detached NaN: the gradient itself stays finite), ``signal``
    (sends SIGTERM / SIGINT named by ``signum`` to this process)."""

    def __init__(
        self,
        faults: dict[int, str] | None = None,
        *,
        max_consecutive_skips: int = 5,
        fault_rank: int | None = None,
        signum: int = signal.SIGTERM,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)
        self.x, self.y = torch.randn(8, 3), torch.randn(8, 1)
        self.faults, self.fault_rank, self.signum = faults or {}, fault_rank, signum
        self.step_optimizer = OptimizerStep(
            max_grad_norm=1.0, max_consecutive_skips=max_consecutive_skips
        )
        self.records: list[Record] = []

    def configure_model(self) -> None:
        self.step_optimizer.configure(self.trainer.strategy)  # DeepSpeed: its clipping

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        mine = self.fault_rank is None or self.global_rank == self.fault_rank
        kind = self.faults.get(len(self.records)) if mine else None
        if kind == "signal":
            os.kill(os.getpid(), self.signum)
        before = self.snapshot()
        nan_grad = self.net.weight.register_hook(lambda g: torch.full_like(g, NAN))
        if kind != "grad":
            nan_grad.remove()
        stats = self.step_optimizer(self, self.optimizers(), [0, 1], lambda i: self.loss(i, kind))
        nan_grad.remove()
        floats = {k: float(v) for k, v in stats.items()}
        self.records.append(Record(kind, before, self.snapshot(), floats))

    def loss(self, part: int, kind: str | None) -> Tensor:
        rows = slice(4 * part, 4 * part + 4)  # each micro-batch's share of the mean over 8 rows
        value = (self.net(self.x[rows]) - self.y[rows]).square().sum() / 8
        if kind == "loss":
            return value * NAN
        return value + torch.tensor(NAN) if kind == "detached" else value

    def snapshot(self) -> dict[str, Tensor]:
        state = {f"weight/{k}": v.detach().clone() for k, v in self.named_parameters()}
        adam = getattr(self.optimizers().optimizer, "state", {})  # DeepSpeed: by partition
        for i, param in enumerate(self.parameters()):
            for key, value in adam.get(param, {}).items():
                state[f"adam/{i}/{key}"] = torch.as_tensor(value).clone()
        return state


def equal(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def fit(
    module: L.LightningModule, root: Path, steps: int, ckpt_path: Path | None = None, **kwargs: Any
) -> L.Trainer:
    trainer = quiet_trainer(root, max_epochs=1, **kwargs)
    trainer.fit(module, DataLoader(torch.zeros(steps, 1)), ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize("kind", ["loss", "grad", "detached"])
def test_a_non_finite_step_is_skipped_and_training_goes_on(tmp_path: Path, kind: str) -> None:
    module = NaNRegression({1: kind})
    with pytest.warns(UserWarning, match="optimizer step 1 skipped: non-finite"):
        trainer = fit(module, tmp_path, steps=4)
    ok, bad, *rest = module.records
    assert not equal(ok.before, ok.after)  # a normal step moves the weights and AdamW state
    assert equal(bad.before, bad.after)  # the skipped one changes neither
    assert [r.stats[SKIPPED_STEPS_KEY] for r in module.records] == [0, 1, 1, 1]
    assert all(not equal(r.before, r.after) for r in rest)  # training went on
    assert trainer.global_step == 3  # optimizer steps taken: the skipped one does not count
    assert all(bool(torch.isfinite(p).all()) for p in module.parameters())


def test_consecutive_skips_stop_the_run_with_the_fix(tmp_path: Path) -> None:
    module = NaNRegression({1: "loss", 2: "loss", 3: "loss"}, max_consecutive_skips=3)
    with pytest.warns(UserWarning), pytest.raises(FloatingPointError) as error:
        fit(module, tmp_path, steps=6)
    message = str(error.value)
    assert "optimizer step 1: non-finite loss" in message  # steps 1-3 skipped: still step 1
    assert "3 consecutive steps (max_consecutive_skips=3)" in message
    assert "lower the learning rate" in message and "max_grad_norm" in message


def test_a_finite_step_resets_the_consecutive_count(tmp_path: Path) -> None:
    module = NaNRegression({1: "loss", 2: "grad", 4: "loss", 5: "grad"}, max_consecutive_skips=3)
    with pytest.warns(UserWarning):
        fit(module, tmp_path, steps=7)
    assert [r.stats[SKIPPED_STEPS_KEY] for r in module.records] == [0, 1, 2, 2, 3, 4, 4]
    state = module.step_optimizer.state_dict()
    assert (state["skipped_steps"], state["consecutive_skips"]) == (4, 0)


def test_skip_counters_round_trip_and_settings_are_checked() -> None:
    skips = NonFiniteSkips(max_consecutive=2)
    skips.load_state_dict({"skipped_steps": 7, "consecutive_skips": 1})
    with pytest.raises(FloatingPointError, match="non-finite gradient in 2 consecutive"):
        skips.record(True, step=9, what="gradient")  # the resumed run's streak continues
    assert skips.state_dict() == {"skipped_steps": 8, "consecutive_skips": 2}
    for bad in (0, -1, True, 1.5 - 1):
        with pytest.raises(ValueError, match="max_consecutive_skips must be an integer >= 1"):
            OptimizerStep(max_grad_norm=None, max_consecutive_skips=bad)  # type: ignore[arg-type]


class NaNLossTerm(L.Callback):
    """A policy-loss term (the callback protocol) that is NaN at rollout ``at``; records the
    logged skip count and the policy's weights after every training batch."""

    def __init__(self, at: int) -> None:
        self.at, self.skipped, self.weights = at, [], []

    def policy_loss_term(self, trainer: Any, module: Any, ctx: Any) -> tuple[Tensor, dict]:
        nan = module.rollout_step == self.at
        return torch.full_like(ctx.per_token_loss, NAN if nan else 0.0), {}

    def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        self.skipped.append(float(trainer.callback_metrics[SKIPPED_STEPS_KEY]))
        self.weights.append([p.detach().clone() for p in module.policy.parameters()])


def test_ppo_module_skips_a_nan_loss_and_trains_on(tiny_model_dir: str, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    module = PPOModule(
        reward=DigitFractionReward(),
        model=tiny_model_dir,
        tokenizer=tokenizer,
        optim={"lr": 1e-3, "micro_batch_size": 4},
        engine=HFGenerationEngine(max_new_tokens=6),
    )
    probe = NaNLossTerm(at=1)
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=3, callbacks=[probe])
    with pytest.warns(UserWarning, match="non-finite loss"):
        trainer.fit(module, prompt_loader(tokenizer, ["1 2", "3 4", "5 6"] * 4, 4))
    assert probe.skipped == [0.0, 1.0, 1.0]
    assert all(torch.equal(a, b) for a, b in zip(*probe.weights[:2], strict=True))
    assert trainer.global_step == 2 and module.rollout_step == 3
    adam = module.optimizers().optimizer.state
    assert {int(state["step"]) for state in adam.values()} == {2}  # AdamW stepped twice


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_signal_leaves_a_resumable_checkpoint_and_exit_code(tmp_path: Path, signum: int) -> None:
    original = signal.getsignal(signum)
    module = NaNRegression({1: "signal"}, signum=signum)
    with pytest.raises(SystemExit) as stop:
        fit(module, tmp_path, steps=5, callbacks=[CheckpointOnInterrupt()])
    assert stop.value.code == 128 + signum
    assert len(module.records) == 2  # the signalled step ran to its end, no further one
    assert signal.getsignal(signum) is original  # the handlers are given back
    path = tmp_path / "checkpoints" / "interrupted.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["global_step"] == 2
    again = NaNRegression()
    trainer = fit(again, tmp_path, steps=5, ckpt_path=path)
    assert len(again.records) == 3 and trainer.global_step == 5  # the 3 batches not yet seen
    resumed, interrupted = again.records[0].before, module.records[-1].after
    torch.testing.assert_close(resumed["weight/net.weight"], interrupted["weight/net.weight"])


def test_lit_rlhf_fit_on_sigterm_saves_a_checkpoint_that_resumes(tmp_path: Path) -> None:
    root = [
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    args = [sys.executable, "-m", "lit_rlhf.cli", "fit",
            "--config", "configs/ppo/countdown_tiny.yaml", *root,
            "--trainer.limit_train_batches=16", "--trainer.limit_val_batches=0",
            "--trainer.logger.init_args.flush_logs_every_n_steps=1"]  # fmt: skip
    output = fit_and_sigterm(args, tmp_path, timeout=120)
    path, step = interrupted_step(tmp_path)
    assert 1 <= step < 16 and "Resume with: lit-rlhf fit" in output
    resumed = resume_one_more_step(args, path, step, timeout=180)
    assert f"`max_steps={step + 1}` reached" in resumed
