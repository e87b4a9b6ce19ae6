"""The learning-rate schedule (lit_rlhf.training.lr_schedule): the shape by hand, where it counts
(per rollout batch or per optimizer step), the total it derives from the trainer, the settings it
refuses, a kill-and-resume that continues with the same lrs and weights, each module stepping
it, and DeepSpeed's optimizer running with it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lit_rlhf.cli import cli_main
from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import (
    CompressorDecoderModule,
    GenerativeRewardModule,
    PPOModule,
    RewardModelModule,
)
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.settings import OptimSettings
from lit_rlhf.training import LRSchedule
from lit_rlhf.training.lr_schedule import LR_KEY, scheduled_total
from tests.distributed.launch import run_python
from tests.helpers import ConstantReward, prompt_loader, quiet_trainer
from tests.reliability.test_kill_resume import (  # noqa: F401 (forked: a fixture)
    COUNTDOWN,
    DIGITS,
    Case,
    finish,
    fit_args,
    forked,
    kill_and_resume,
    same,
    start,
    step_metrics,
)
from tests.training.record_lr import RecordLR

REPO = Path(__file__).resolve().parents[2]


def lrs_of(settings: OptimSettings, steps: int, lr: float = 1e-3, **trainer: Any) -> list:
    """The lr of ``steps`` optimizer steps of one param group (one step per batch)."""
    group = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([group], lr=lr)
    schedule = LRSchedule(settings)
    fit = SimpleNamespace(**trainer) if trainer else None
    return [schedule.apply(fit, optimizer) for _ in range(steps)]


# ------------------------------------------------------------------------- the shape, by hand
def test_warmup_then_cosine_schedule_reaches_the_hand_computed_lr() -> None:
    settings = OptimSettings(
        lr_warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1, lr_total_steps=10
    )
    lrs = lrs_of(settings, 13, lr=1e-3)
    # warmup: lr x step / 2
    assert lrs[0] == 0.0  # 1e-3 x 0/2 (as verl / transformers: the first warmup step is at 0)
    assert lrs[1] == pytest.approx(5e-4)  # 1e-3 x 1/2
    # cosine from lr to 0.1 lr over steps 2..10: lr x (0.1 + 0.9 x (1 + cos(pi p)) / 2),
    # p = (step - 2) / 8
    assert lrs[2] == pytest.approx(1e-3)  # p 0: cos 0 = 1 -> 0.1 + 0.9 = 1
    assert lrs[6] == pytest.approx(5.5e-4)  # p 0.5: cos(pi/2) = 0 -> 0.1 + 0.45 = 0.55
    assert lrs[10] == pytest.approx(1e-4)  # p 1: cos(pi) = -1 -> 0.1
    assert lrs[12] == pytest.approx(1e-4)  # after the total: held at 0.1 lr


def test_warmup_ratio_then_linear_schedule_by_hand() -> None:
    settings = OptimSettings(
        lr_warmup_ratio=0.25, lr_schedule="linear", min_lr_ratio=0.5, lr_total_steps=10
    )
    assert settings.warmup_steps(10) == 2  # int(0.25 x 10) = int(2.5) = 2, rounded down as verl
    lrs = lrs_of(settings, 11, lr=2e-3)
    assert lrs[1] == pytest.approx(1e-3)  # 2e-3 x 1/2
    # linear from 1 to 0.5 over steps 2..10: 1 - 0.5 x (step - 2) / 8
    assert lrs[6] == pytest.approx(1.5e-3)  # 1 - 0.5 x 4/8 = 0.75 -> 1.5e-3
    assert lrs[10] == pytest.approx(1e-3)  # 0.5 x 2e-3


def test_schedule_scales_every_param_group_from_its_own_base_lr() -> None:
    policy, critic = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([{"params": [policy], "lr": 1e-3}, {"params": [critic]}], lr=1e-2)
    schedule = LRSchedule(OptimSettings(lr_warmup_steps=4))
    for _ in range(3):
        schedule.apply(None, optimizer)
    # the third step: factor 2/4 of each group's own lr; the base kept as initial_lr
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([5e-4, 5e-3])
    assert [g["initial_lr"] for g in optimizer.param_groups] == [1e-3, 1e-2]


def test_constant_schedule_without_warmup_keeps_the_lr() -> None:
    assert lrs_of(OptimSettings(), 3, lr=1e-5) == pytest.approx([1e-5] * 3)


# ------------------------------------------------------------------ the total, from the trainer
@pytest.mark.parametrize(
    ("interval", "max_epochs", "batches", "max_steps", "per_batch", "total"),
    [
        ("batch", 2, 5, -1, 2, 10),  # 2 epochs x 5 batches
        ("optimizer_step", 2, 5, -1, 2, 20),  # 10 batches x 2 optimizer steps
        ("batch", -1, math.inf, 5, 2, 3),  # max_steps 5 optimizer steps: ceil(5 / 2) batches
        ("optimizer_step", -1, math.inf, 5, 2, 6),  # 3 batches x 2 (the run ends at step 6)
        ("batch", 3, 4, 7, 1, 7),  # min(3 x 4, 7 / 1)
        ("batch", 1, 4, 100, 2, 4),  # the epoch ends first: min(4, 50)
        ("batch", -1, math.inf, -1, 1, None),  # no end
    ],
)
def test_schedule_total_derived_from_the_trainer(
    interval: Any, max_epochs: int, batches: float, max_steps: int, per_batch: int, total: Any
) -> None:
    got = scheduled_total(
        interval,
        max_epochs=max_epochs,
        batches_per_epoch=batches,
        max_steps=max_steps,
        steps_per_batch=per_batch,
    )
    assert got == total


# --------------------------------------------------------------------------- refused settings
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(lr_warmup_steps=2, lr_warmup_ratio=0.1), "set only one of them"),
        (dict(lr_warmup_ratio=1.0), r"lr_warmup_ratio=1.0 must be in \[0, 1\)"),
        (dict(lr_warmup_steps=-1), "lr_warmup_steps=-1 must be an integer >= 0"),
        (dict(lr_schedule="exponential"), r"lr_schedule='exponential' is not one of"),
        (dict(lr_interval="epoch"), r"lr_interval='epoch' is not one of"),
        (dict(min_lr_ratio=0.1), "lr_schedule is 'constant': it would do nothing"),
        (dict(lr_schedule="cosine", min_lr_ratio=1.0), "min_lr_ratio=1 ends the cosine decay"),
        (dict(lr_schedule="linear", min_lr_ratio=1.5), r"min_lr_ratio=1.5 must be in \[0, 1\]"),
        (dict(lr_interval="optimizer_step"), "there is no schedule"),
        (dict(lr_total_steps=10), "lr_total_steps=10 is read only by"),
        (dict(lr_schedule="cosine", lr_total_steps=0), "lr_total_steps=0 must be an integer"),
        (
            dict(lr_schedule="cosine", lr_warmup_steps=10, lr_total_steps=10),
            "the lr warmup takes 10 steps of the optim.lr_total_steps=10 training batches",
        ),
        (
            dict(lr_schedule="cosine", lr_warmup_ratio=0.05, lr_total_steps=10),
            "rounds down to no warmup step",
        ),
    ],
)
@pytest.mark.parametrize("module", ["ppo", "grm", "compressor", "rm"])
def test_refused_schedule_settings_fail_when_the_module_is_built(
    module: str, kwargs: dict[str, Any], message: str
) -> None:
    build = {
        "ppo": lambda **kw: PPOModule(reward=ConstantReward(1.0), **kw),
        "grm": GenerativeRewardModule,
        "compressor": CompressorDecoderModule,
        "rm": RewardModelModule,
    }[module]
    with pytest.raises(ValueError, match=message) as error:
        build(optim=kwargs)  # builds no model: the refusal comes first
    assert "Fix:" in str(error.value)


def test_refused_schedule_for_the_derived_total() -> None:
    # 3 training batches: a warmup of 3 never reaches the lr
    warmup = OptimSettings(lr_warmup_steps=3, lr_schedule="cosine")
    trainer = dict(max_epochs=1, num_training_batches=3, max_steps=-1)
    with pytest.raises(ValueError, match=r"warmup takes 3 steps of the 3 training batches der"):
        lrs_of(warmup, 1, **trainer)
    # no end to the run and no lr_total_steps: a cosine has nothing to end at
    cosine = OptimSettings(lr_schedule="cosine")
    endless = dict(max_epochs=-1, num_training_batches=math.inf, max_steps=-1)
    with pytest.raises(ValueError, match=r"set model\.init_args\.optim\.lr_total_steps"):
        lrs_of(cosine, 1, **endless)
    # a ratio of a short run (a test run of a preset) that rounds to no step: a warning
    with pytest.warns(UserWarning, match="rounds down to no warmup step"):
        lrs = lrs_of(OptimSettings(lr_warmup_ratio=0.1), 2, **trainer)
    assert lrs == pytest.approx([1e-3, 1e-3])


def test_schedule_resumed_under_other_trainer_limits_warns_and_follows_the_new_total() -> None:
    group = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([group], lr=1e-3)
    first = LRSchedule(OptimSettings(lr_schedule="linear", min_lr_ratio=0.5))
    first.apply(SimpleNamespace(max_epochs=1, num_training_batches=10, max_steps=-1), optimizer)
    resumed = LRSchedule(first.optim)
    resumed.load_state_dict(first.state_dict())  # 1 batch done of a total of 10
    with pytest.warns(UserWarning, match="total changed from 10 to 5 steps"):
        lr = resumed.apply(
            SimpleNamespace(max_epochs=1, num_training_batches=5, max_steps=-1), optimizer
        )
    assert lr == pytest.approx(1e-3 * (1 - 0.5 * 1 / 5))  # count 1 of the new total 5: 0.9 lr


def test_cli_lr_scheduler_refusal_names_the_schedule_settings(capsys) -> None:
    with pytest.raises(SystemExit):
        cli_main(["fit", "--config", str(REPO / COUNTDOWN), "--lr_scheduler=StepLR"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Fix: leave them out and set the module's own schedule" in last
    for key in ("lr_warmup_steps", "lr_warmup_ratio", "lr_schedule", "min_lr_ratio"):
        assert key in last
    assert "lr_interval" in last and "lr_total_steps" in last


# ------------------------------------------------------- per rollout batch or per optimizer step
PROMPTS = [f"Using the numbers [{i}, {i + 3}]" for i in range(12)]


def ppo_lrs(tiny_model_dir: str, root: Path, interval: str) -> tuple[Any, RecordLR]:
    """3 rollout batches of 4 prompts x 2 samples, mini-batches of 4: 2 optimizer steps each."""
    module = PPOModule(
        reward=ConstantReward(1.0),
        model=tiny_model_dir,
        tokenizer=load_tokenizer(tiny_model_dir),
        engine=HFGenerationEngine(max_new_tokens=4),
        rollout={"samples_per_prompt": 2},
        update={"mini_batch_size": 4},
        optim=OptimSettings(
            micro_batch_size=4,
            lr=1e-3,
            lr_warmup_steps=1,
            lr_schedule="linear",
            min_lr_ratio=0.5,
            lr_interval=interval,  # type: ignore[arg-type]
        ),
    )
    record = RecordLR()
    trainer = quiet_trainer(root, limit_train_batches=3, callbacks=[record])
    trainer.fit(module, prompt_loader(module.tokenizer, PROMPTS, 4))
    return trainer, record


def test_schedule_interval_batch_steps_once_per_rollout(tiny_model_dir: str, tmp_path) -> None:
    trainer, record = ppo_lrs(tiny_model_dir, tmp_path, "batch")
    lr = trainer.lightning_module.rl.step_optimizer.lr
    assert lr.total == 3  # derived: 1 epoch x 3 batches (limit_train_batches)
    # per batch: warmup 0; then linear 1 -> 0.5 over batches 1..3: 1 - 0.5 x (b - 1) / 2
    per_step = [lrs[0] for lrs in record.lrs]
    assert per_step == pytest.approx([0.0, 0.0, 1e-3, 1e-3, 7.5e-4, 7.5e-4])
    assert trainer.global_step == 6 and (lr.batches, lr.steps) == (3, 6)
    assert float(trainer.callback_metrics[LR_KEY]) == pytest.approx(7.5e-4)


def test_schedule_interval_optimizer_step_changes_within_a_rollout(
    tiny_model_dir: str, tmp_path
) -> None:
    trainer, record = ppo_lrs(tiny_model_dir, tmp_path, "optimizer_step")
    assert trainer.lightning_module.rl.step_optimizer.lr.total == 6  # 3 batches x 2 steps
    # per step: warmup 0; then linear 1 -> 0.5 over steps 1..6: 1 - 0.5 x (s - 1) / 5
    per_step = [lrs[0] for lrs in record.lrs]
    assert per_step == pytest.approx([0.0, 1e-3, 9e-4, 8e-4, 7e-4, 6e-4])
    # train/lr: the rollout's last optimizer step's lr (not the mean, 6.5e-4)
    assert float(trainer.callback_metrics[LR_KEY]) == pytest.approx(6e-4)


# ------------------------------------------------------------------------ kill and resume
# Countdown, 2 optimizer steps per rollout (16 sequences, mini-batches of 8), max_steps 5: 3
# rollout batches; a warmup of 1 batch, then a cosine to 0.1 lr over batches 1..3
RESUMED = Case(
    COUNTDOWN,
    (
        *DIGITS,
        "--model.init_args.update.mini_batch_size=8",
        "--model.init_args.optim.lr_warmup_steps=1",
        "--model.init_args.optim.lr_schedule=cosine",
        "--model.init_args.optim.min_lr_ratio=0.1",
    ),
)


def test_schedule_survives_a_kill_and_resume_exactly(
    forked: Any,  # noqa: F811 (the fixture imported above)
    tiny_model_dir: str,
    tmp_path: Path,
) -> None:
    full, broken = tmp_path / "full", tmp_path / "broken"
    reference = start(forked, fit_args(RESUMED, full, "full"), full.with_suffix(".log"))
    try:
        resumed_at = kill_and_resume(forked, RESUMED, broken)
        finish(reference, full.with_suffix(".log"))
    finally:
        if reference.is_alive():
            reference.kill()

    expected, got = step_metrics(full, "full"), step_metrics(broken, "resumed")
    lrs = [expected[step][LR_KEY] for step in sorted(expected) if LR_KEY in expected[step]]
    # lr 1e-3: batch 0 warmup 0; batch 1 cosine p 0 -> 1e-3; batch 2 p 1/2 -> 0.1 + 0.9 x 0.5
    assert lrs == pytest.approx([0.0, 1e-3, 5.5e-4])
    # the CSV's step counts batches here (2 optimizer steps each): the resumed run logs from the
    # batch after its checkpoint's (global step resumed_at) to the end
    resumed = [step for step in sorted(got) if LR_KEY in got[step]]
    assert resumed == [step for step in sorted(expected) if step >= resumed_at // 2]
    for step in resumed:  # the same lr, and every other metric, at every step after the resume
        assert got[step].keys() == expected[step].keys(), step
        assert all(same(k, expected[step][k], v) for k, v in got[step].items()), step

    a = torch.load(full / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(broken / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == 6
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, weight in a["state_dict"].items():
        assert torch.equal(weight, b["state_dict"][name]), name
    assert a["lit_rlhf"]["optimizer_step"] == b["lit_rlhf"]["optimizer_step"]
    assert a["lit_rlhf"]["optimizer_step"]["lr_schedule"] == {
        "batches": 3, "steps": 6, "base_lrs": [1e-3], "total": 3
    }  # fmt: skip


# ------------------------------------------------------------------- GRM, compressor and RM
SCHEDULE = (
    "--model.init_args.optim.lr_warmup_steps=1",
    "--model.init_args.optim.lr_schedule=linear",
    "--model.init_args.optim.min_lr_ratio=0.5",
)


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        ("configs/grm/rft_tiny.yaml", ()),
        ("configs/compressor/tiny.yaml", ()),
        ("configs/rm/bt_tiny.yaml", ("--model.init_args.export_dir=null",)),
        ("configs/sft/tiny.yaml", ("--model.init_args.export_dir=null",)),
    ],
    ids=["grm", "compressor", "rm", "sft"],
)
def test_module_lr_follows_the_schedule(
    tiny_model_dir: str, tmp_path: Path, config: str, extra: tuple[str, ...]
) -> None:
    cli = cli_main(
        ["fit", "--config", str(REPO / config), *SCHEDULE, *extra,
         "--trainer.max_steps=3", "--trainer.limit_val_batches=0", "--trainer.logger=false",
         "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
         f"--trainer.default_root_dir={tmp_path}",
         "--trainer.callbacks+=tests.training.record_lr.RecordLR"]
    )  # fmt: skip
    (record,) = [c for c in cli.trainer.callbacks if isinstance(c, RecordLR)]
    # lr 1e-3, 3 batches of one optimizer step (max_steps 3): warmup 0, then linear 1 -> 0.5
    # over batches 1..3: 1 - 0.5 x (b - 1) / 2
    assert [lrs[0] for lrs in record.lrs] == pytest.approx([0.0, 1e-3, 7.5e-4])
    assert float(cli.trainer.callback_metrics[LR_KEY]) == pytest.approx(7.5e-4)
    assert not record.changed[0]  # lr 0: AdamW leaves every weight as it was


# -------------------------------------------------------------------------------- DeepSpeed
def test_deepspeed_optimizer_steps_with_the_schedule_lr(tiny_model_dir: str, tmp_path) -> None:
    """One CPU process under ZeRO-2: the lr reaches the base optimizer inside DeepSpeed's
    wrapper (weights unchanged at the warmup's lr 0, changed at lr 1e-3) and no DeepSpeed
    scheduler steps it."""
    out = tmp_path / "lr.json"
    run_python(
        "-m", "lit_rlhf.cli", "fit", "--config", COUNTDOWN,
        "--config", "configs/trainer/cpu_deepspeed_zero2.yaml", "--trainer.devices=1",
        *DIGITS, *SCHEDULE, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.callbacks+=tests.training.record_lr.RecordLR",
        f"--trainer.callbacks.path={out}",
    )  # fmt: skip
    seen = json.loads(out.read_text())
    # 2 batches: warmup 0, then the linear decay's start (1e-3)
    assert [lrs[0] for lrs in seen["lrs"]] == pytest.approx([0.0, 1e-3])
    assert seen["changed"] == [False, True]


@pytest.mark.parametrize(("interval", "total"), [("batch", 4), ("optimizer_step", 8)])
def test_idle_batches_are_left_out_of_the_derived_total(interval: Any, total: int) -> None:
    """One-step-off training's first max_staleness batches take no optimizer step: the derived
    total leaves them out (here 5 batches, 1 idle, 2 optimizer steps per batch)."""
    settings = OptimSettings(lr_schedule="cosine", lr_interval=interval)
    trainer = SimpleNamespace(max_epochs=1, num_training_batches=5, max_steps=-1)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = LRSchedule(settings, idle_batches=1)
    schedule.apply(trainer, optimizer, (0, 2))
    assert schedule.total == total
    with pytest.raises(ValueError, match="idle_batches must be >= 0"):
        LRSchedule(settings, idle_batches=-1)
