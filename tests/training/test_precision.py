"""Precision: trainable weights are never stepped in 16 bits without float32 master weights
(refused in ``setup``, before any weights load), and ``precision: auto`` resolves for the
hardware (a mocked CPU-feature list, both kinds, and a GPU)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from lit_rlhf.cli import cli_main
from lit_rlhf.strategies import CPUDeepSpeedStrategy
from lit_rlhf.training import check_trainable_precision, resolve_precision
from lit_rlhf.training import precision as precision_module
from lit_rlhf.training.precision import choose_precision, cpu_flags
from tests.distributed.launch import fit_with_fragment

REPO = Path(__file__).resolve().parents[2]
PPO, RM = "configs/ppo/countdown_tiny.yaml", "configs/rm/bt_tiny.yaml"
ZEN3_FLAGS = "fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni"  # no bf16 instructions
SAPPHIRE_RAPIDS_FLAGS = f"{ZEN3_FLAGS} avx512_bf16 amx_bf16 amx_tile amx_int8"


def _trainer(strategy: Any, precision: str) -> Any:
    return SimpleNamespace(strategy=strategy, precision=precision)


# ------------------------------------------------------------------------ why the rule exists
def test_bf16_weights_lose_most_small_adamw_updates() -> None:
    """10 AdamW steps at lr 1e-6 on a weight of std 0.02: every float32 entry moves, and only
    the few bf16 entries small enough that an update reaches half a bf16 ulp do."""
    torch.manual_seed(0)
    start = torch.randn(256, 256) * 0.02
    moved = {}
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.nn.Parameter(start.to(dtype).clone())
        before = weight.detach().clone()
        optimizer = torch.optim.AdamW([weight], lr=1e-6, weight_decay=0.0)
        for _ in range(10):
            weight.grad = torch.randn_like(weight)
            optimizer.step()
        moved[dtype] = (weight.detach() != before).float().mean().item()
    assert moved[torch.float32] > 0.999
    assert moved[torch.bfloat16] < 0.05


# -------------------------------------------------------------------- check_trainable_precision
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("strategy", [SingleDeviceStrategy("cpu"), DDPStrategy()])
def test_16_bit_trainable_weights_without_deepspeed_are_refused(strategy: Any, dtype: str) -> None:
    with pytest.raises(ValueError) as err:
        check_trainable_precision(_trainer(strategy, "bf16-mixed"), {"precision.dtype": dtype})
    message = str(err.value)
    assert f"model.init_args.precision.dtype: {dtype}" in message  # the setting
    assert "no float32 master weights" in message  # the cause
    assert (
        "model.init_args.precision.dtype: float32 with trainer.precision: bf16-mixed" in message
    )  # fix
    assert "configs/trainer/deepspeed_zero2.yaml" in message


@pytest.mark.parametrize("precision", ["bf16-true", "16-true", "transformer-engine"])
def test_true_half_precision_without_deepspeed_is_refused(precision: str) -> None:
    """Lightning's true half precision casts the float32 weights: refused even with dtype
    float32."""
    with pytest.raises(ValueError, match=f"trainer.precision: {precision} under DDPStrategy"):
        check_trainable_precision(_trainer(DDPStrategy(), precision), {"dtype": "float32"})


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "64-true"])
def test_float32_weights_pass_under_every_precision_that_keeps_them(precision: str) -> None:
    check_trainable_precision(_trainer(DDPStrategy(), precision), {"dtype": "float32"})
    check_trainable_precision(_trainer(SingleDeviceStrategy("cpu"), precision), {})


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "16-mixed"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_deepspeed_with_its_half_optimizer_allows_16_bit_weights(precision: str, dtype: str):
    strategy = CPUDeepSpeedStrategy(stage=2)
    check_trainable_precision(_trainer(strategy, precision), {"dtype": dtype})


def test_deepspeed_without_bf16_refuses_16_bit_weights() -> None:
    strategy = CPUDeepSpeedStrategy(stage=2)
    check_trainable_precision(_trainer(strategy, "32-true"), {"dtype": "float32"})
    with pytest.raises(ValueError, match="DeepSpeed's bf16 optimizer is off") as err:
        check_trainable_precision(_trainer(strategy, "32-true"), {"dtype": "bfloat16"})
    assert "Fix: set trainer.precision: bf16-mixed" in str(err.value)


def test_deepspeed_config_of_its_own_decides() -> None:
    """A DeepSpeed config with a ``bf16`` section wins over ``precision`` (Lightning adds one
    only where the config has none)."""
    on = CPUDeepSpeedStrategy(config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    check_trainable_precision(_trainer(on, "32-true"), {"dtype": "bfloat16"})
    off = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": False}}
    with pytest.raises(ValueError, match="bf16 optimizer is off"):
        check_trainable_precision(
            _trainer(CPUDeepSpeedStrategy(config=off), "bf16-mixed"), {"dtype": "bfloat16"}
        )


# -------------------------------------------------------------------------- precision: auto
@pytest.mark.parametrize(
    ("device", "flags", "cuda_bf16", "expected"),
    [
        ("cpu", SAPPHIRE_RAPIDS_FLAGS, False, "bf16-mixed"),  # AVX512-BF16 and AMX
        ("cpu", f"{ZEN3_FLAGS} avx512_bf16", False, "bf16-mixed"),  # Zen 4: AVX512-BF16 only
        ("cpu", f"{ZEN3_FLAGS} amx_bf16", False, "bf16-mixed"),
        ("cpu", ZEN3_FLAGS, True, "32-true"),  # no native bf16: float32
        ("cpu", "", False, "32-true"),  # no flags known (not Linux)
        ("cuda", "", True, "bf16-mixed"),  # Ampere or newer
        ("cuda", SAPPHIRE_RAPIDS_FLAGS, False, "32-true"),  # pre-Ampere: the host CPU is moot
        ("other", SAPPHIRE_RAPIDS_FLAGS, True, "32-true"),
    ],
)
def test_auto_precision_for_the_hardware(device, flags, cuda_bf16, expected) -> None:
    chosen, reason = choose_precision(device, cpu_flags=flags.split(), cuda_bf16=cuda_bf16)
    assert chosen == expected
    if device == "cpu":
        assert ("native" in reason) and (("no native" in reason) == (expected == "32-true"))


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    block = f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {SAPPHIRE_RAPIDS_FLAGS}\n\n"
    cpuinfo.write_text(block + block.replace(": 0", ": 1"))
    assert {"avx512_bf16", "amx_bf16", "avx2"} <= cpu_flags(cpuinfo)
    assert "Some" not in cpu_flags(cpuinfo)
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize(
    ("flags", "expected"), [(ZEN3_FLAGS, "32-true"), (SAPPHIRE_RAPIDS_FLAGS, "bf16-mixed")]
)
def test_resolve_auto_on_cpu_logs_its_choice(monkeypatch, caplog, flags, expected) -> None:
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: frozenset(flags.split()))
    with caplog.at_level(logging.INFO):
        assert resolve_precision("auto", "cpu") == expected
    assert f"precision: auto -> {expected}: the CPU" in caplog.text


def test_resolve_auto_on_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", "gpu") == "bf16-mixed"
    assert resolve_precision("auto", "auto") == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_precision("auto", "cuda") == "32-true"


@pytest.mark.parametrize("explicit", ["bf16-mixed", "32-true", "16-mixed", 32, None])
def test_an_explicit_precision_is_never_overridden(monkeypatch, explicit) -> None:
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: frozenset(ZEN3_FLAGS.split()))
    assert resolve_precision(explicit, "cpu") == explicit


# ------------------------------------------------------------------ the modules, through the CLI
def _fit_args(config: str, root: Path, *extra: str) -> list[str]:
    args = ["fit", "--config", str(REPO / config), f"--trainer.default_root_dir={root}",
            "--trainer.logger=false", "--trainer.max_steps=1",
            "--trainer.limit_val_batches=0"]  # fmt: skip
    if config == RM:
        args.append("--model.init_args.export_dir=null")
    else:
        args.append("--trainer.callbacks=[]")  # the config's plot reads a logger's folder
    return [*args, *extra]


@pytest.mark.parametrize("config", [PPO, RM])
def test_bf16_trainable_weights_are_refused_before_any_load(config: str, tmp_path: Path) -> None:
    """``lit-rlhf fit --config <tiny> --model.init_args.precision.dtype=bfloat16``: refused in
    ``setup``
    with the fix named, before the networks load (the run used to save bf16 weights and bf16
    Adam state)."""
    args = _fit_args(config, tmp_path, "--model.init_args.precision.dtype=bfloat16")[
        1:
    ]  # no subcommand
    cli = cli_main(args, run=False)
    with pytest.raises(ValueError, match=r"model\.init_args\.precision\.dtype: bfloat16") as err:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert (
        "Fix: set model.init_args.precision.dtype: float32 with trainer.precision: bf16-mixed"
        in str(err.value)
    )
    network = cli.model.policy if config == PPO else cli.model.model
    assert network is None  # configure_model never ran
    assert not list(tmp_path.glob("**/*.ckpt"))


def _checkpoint_dtypes(path: Path) -> tuple[set[torch.dtype], set[torch.dtype]]:
    """The floating dtypes of a checkpoint's weights and of its Adam moments."""
    ckpt = torch.load(path, weights_only=True)
    weights = {t.dtype for t in ckpt["state_dict"].values() if t.is_floating_point()}
    (optimizer,) = ckpt["optimizer_states"]
    assert optimizer["state"], "the optimizer took no step"
    moments = {s[k].dtype for s in optimizer["state"].values() for k in ("exp_avg", "exp_avg_sq")}
    return weights, moments


@pytest.mark.parametrize("config", [PPO, RM])
def test_float32_weights_under_bf16_mixed_keep_float32_adam_state(config, tmp_path) -> None:
    cli = cli_main(_fit_args(config, tmp_path, "--trainer.precision=bf16-mixed"))
    assert cli.trainer.global_step == 1 and cli.trainer.precision == "bf16-mixed"
    (ckpt,) = [p for p in tmp_path.glob("checkpoints/*.ckpt") if p.name != "last.ckpt"]
    assert _checkpoint_dtypes(ckpt) == ({torch.float32}, {torch.float32})


def test_deepspeed_zero2_bf16_keeps_float32_masters_and_adam_state(tmp_path: Path) -> None:
    """CPU DeepSpeed ZeRO-2 with ``precision: bf16-mixed`` and ``dtype: bfloat16`` is allowed:
    the module's weights are bf16, and the optimizer's float32 master partition and Adam moments
    are float32 (DeepSpeed's bf16 optimizer)."""
    fit_with_fragment(
        "cpu_deepspeed_zero2", tmp_path, "--trainer.devices=1", "--trainer.precision=bf16-mixed",
        "--model.init_args.precision.dtype=bfloat16", "--trainer.fast_dev_run=false",
        "--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--trainer.logger=false",
        "--trainer.callbacks=[]",
    )  # fmt: skip
    (folder,) = tmp_path.glob("checkpoints/*.ckpt/checkpoint")
    model = torch.load(folder / "mp_rank_00_model_states.pt", weights_only=False)
    assert {t.dtype for t in model["module"].values()} == {torch.bfloat16}
    (optim_file,) = folder.glob("bf16_zero_pp_rank_0_*optim_states.pt")
    state = torch.load(optim_file, weights_only=False)["optimizer_state_dict"]
    masters = state["single_partition_of_fp32_groups"]
    moments = [t for s in state["base_optimizer_state"]["state"].values() for t in s.values()]
    assert {t.dtype for t in [*masters, *moments] if t.dim() > 0} == {torch.float32}


def test_a_frozen_reference_may_be_bf16_beside_a_float32_policy(tmp_path: Path) -> None:
    """``reference_dtype: bfloat16`` with ``dtype: float32``: the reference (frozen) is stored
    in bf16, the policy trains in float32; a KL step runs under plain float32 precision, and
    the checkpoint holds only float32 trained weights and Adam state (no reference in it)."""
    args = _fit_args(PPO, tmp_path, "--model.init_args.kl.coef=0.1",
                     "--model.init_args.precision.reference_dtype=bfloat16")  # fmt: skip
    cli = cli_main(args)
    assert cli.model.ref_policy.dtype == torch.bfloat16
    assert cli.model.policy.dtype == torch.float32
    metrics = cli.trainer.callback_metrics
    # the rollout policy is the starting one: the KL is bf16 rounding of the reference only
    assert abs(float(metrics["rollout/kl"])) < 0.01 and torch.isfinite(metrics["ppo/kl_loss"])
    (ckpt,) = [p for p in tmp_path.glob("checkpoints/*.ckpt") if p.name != "last.ckpt"]
    assert _checkpoint_dtypes(ckpt) == ({torch.float32}, {torch.float32})
