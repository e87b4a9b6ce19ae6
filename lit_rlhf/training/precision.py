"""Precision rules: no trainable network is stepped in 16 bits without float32 master weights, and
``precision: auto`` picks the precision that fits the hardware.

Why the first rule: AdamW on bfloat16 weights adds each update to a number with an 8-bit
mantissa, so an update smaller than about 1/256 of the weight rounds away. Ten AdamW steps at
lr 1e-6 on a 1536x1536 weight (std 0.02) change 99.99 % of the entries in float32 and 1.9 % in
bfloat16 (issue 21). Mixed precision (Micikevicius et al. 2018, arXiv 1710.03740) keeps float32
master weights for that reason; so do Lightning's ``bf16-mixed`` (autocast over float32 weights)
and DeepSpeed's bf16 / fp16 optimizers (ZeRO keeps float32 master partitions). Lightning's
``bf16-true`` / ``16-true`` and a module ``dtype: bfloat16`` under a plain optimizer keep none.

Why ``auto``: bf16 autocast is fast where the hardware multiplies bf16 natively (CUDA GPUs from
Ampere on; x86 CPUs with AVX512-BF16 or AMX) and several times slower than float32 on a CPU
without it (there torch emulates bf16: matmuls 60 vs 288 GFLOP/s float32 on such a machine).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, cast

import torch
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
from lightning.pytorch.utilities import rank_zero_info

from lit_rlhf.strategies import is_deepspeed

HALF_DTYPES = ("bfloat16", "float16")
# Lightning precisions that cast every weight to 16 bits with no float32 copy
_CAST_WEIGHTS = ("bf16-true", "16-true", "transformer-engine", "transformer-engine-float16")
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
_FIX = (
    "Fix: set {setting}: float32 with trainer.precision: bf16-mixed (bf16 autocast over float32 "
    "weights and float32 Adam state), or compose configs/trainer/deepspeed_zero2.yaml (DeepSpeed's "
    "bf16 optimizer keeps float32 master weights)."
)

Device = Literal["cpu", "cuda", "other"]


def check_trainable_precision(trainer: Any, dtypes: Mapping[str, str]) -> None:
    """Refuse, in a module's ``setup`` (the strategy is known, no weights are loaded yet), a run
    that would step trainable weights in 16 bits without float32 master weights.

    ``dtypes``: the module's settings that hold a trainable network's dtype, by name (e.g.
    ``{"dtype": "bfloat16"}``). Allowed: every such dtype ``float32`` under a precision that
    keeps the weights' dtype (``32-true``, ``bf16-mixed``, ``16-mixed``); or any dtype under
    DeepSpeed with its bf16 / fp16 optimizer enabled. Frozen networks are not the caller's to
    list: they may stay 16-bit.
    """
    strategy, precision = trainer.strategy, str(trainer.precision)
    half = [(name, str(dtype)) for name, dtype in dtypes.items() if str(dtype) in HALF_DTYPES]
    under = f"under {type(strategy).__name__}"
    if is_deepspeed(strategy):
        if half and not deepspeed_half_enabled(strategy, precision):
            name, dtype = half[0]
            raise ValueError(
                f"model.init_args.{name}: {dtype} {under} with trainer.precision: {precision}: "
                f"DeepSpeed's bf16 optimizer is off, so the optimizer would step {dtype} weights "
                "with no float32 master weights and most small updates round away. Fix: set "
                "trainer.precision: bf16-mixed (DeepSpeed then keeps float32 master weights), or "
                f"model.init_args.{name}: float32."
            )
        return  # DeepSpeed's bf16 / fp16 optimizer keeps float32 master weights
    if half:
        name, dtype = half[0]
        raise ValueError(
            f"model.init_args.{name}: {dtype} trains the weights in {dtype} with a plain AdamW "
            f"{under} (trainer.precision: {precision}): there are no float32 master weights, so "
            "most small updates round away (10 AdamW steps at lr 1e-6 change 1.9 % of a bf16 "
            "weight's entries, 99.99 % in float32). "
            + _FIX.format(setting=f"model.init_args.{name}")
        )
    if precision in _CAST_WEIGHTS:
        raise ValueError(
            f"trainer.precision: {precision} {under} casts every weight, the trainable ones too, "
            "to 16 bits with no float32 master weights, so most small updates round away. "
            + _FIX.format(setting="model.init_args.precision.dtype")
        )


def deepspeed_half_enabled(strategy: Any, precision: str) -> bool:
    """Whether DeepSpeed will run its bf16 / fp16 optimizer (float32 master weights): the
    strategy's DeepSpeed config says so, or Lightning adds it there from ``precision`` (as
    ``_format_precision_config`` does, for a key the config does not set)."""
    config = getattr(strategy, "config", None) or {}
    implied = {"fp16": precision in ("16-mixed", "16-true"),
               "bf16": precision in ("bf16-mixed", "bf16-true")}  # fmt: skip
    for key, from_precision in implied.items():
        if key in config:
            if bool(config[key].get("enabled", False)):
                return True
        elif from_precision:
            return True
    return False


def choose_precision(
    device: Device, *, cpu_flags: Iterable[str], cuda_bf16: bool
) -> tuple[str, str]:
    """The precision ``auto`` stands for, and why (pure: the hardware facts are arguments).

    - a CUDA GPU that supports bf16 (Ampere or newer): ``bf16-mixed``; one that does not:
      ``32-true`` (``16-mixed`` needs a loss scaler, which manual optimisation would have to
      drive);
    - a CPU with native bf16 (``avx512_bf16`` or ``amx_bf16`` among its flags): ``bf16-mixed``;
      without: ``32-true`` (emulated bf16 is several times slower than float32);
    - any other accelerator: ``32-true``.
    """
    if device == "cuda":
        if cuda_bf16:
            return "bf16-mixed", "the CUDA GPU supports bf16"
        return "32-true", "the CUDA GPU has no bf16 support (pre-Ampere)"
    if device == "cpu":
        native = sorted(set(cpu_flags) & set(CPU_BF16_FLAGS))
        if native:
            return "bf16-mixed", f"the CPU multiplies bf16 natively ({', '.join(native)})"
        return "32-true", (
            "the CPU has no native bf16 (no avx512_bf16 / amx_bf16 flag): emulated bf16 "
            "autocast is several times slower than float32"
        )
    return "32-true", "no bf16 rule for this accelerator"


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where it does not exist)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def accelerator_device(accelerator: Any = "auto") -> Device:
    """The kind of device Lightning's ``accelerator`` flag (a name or an Accelerator) stands
    for: ``auto`` is CUDA when available, else the CPU unless Apple's MPS is there."""
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__
    name = name.lower().removesuffix("accelerator")
    cuda = torch.cuda.is_available()
    if name == "cpu":
        return "cpu"
    if name == "cuda" or (name == "gpu" and cuda):
        return "cuda"
    if name == "auto":
        if cuda:
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        return "other" if mps is not None and mps.is_available() else "cpu"
    return "other"


def resolve_precision(
    precision: _PRECISION_INPUT | Literal["auto"] | None, accelerator: Any = "auto"
) -> _PRECISION_INPUT | None:
    """``precision`` itself, or for ``"auto"`` the one :func:`choose_precision` picks for
    ``accelerator`` on this machine, logged (rank zero) with the reason. Use it when building a
    ``Trainer`` yourself: ``Trainer(precision=resolve_precision("auto", "cpu"), ...)``."""
    if precision != "auto":
        return precision
    device = accelerator_device(accelerator)
    cuda_bf16 = device == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    flags = cpu_flags() if device == "cpu" else frozenset()
    chosen, reason = choose_precision(device, cpu_flags=flags, cuda_bf16=cuda_bf16)
    rank_zero_info(f"precision: auto -> {chosen}: {reason}")
    return cast(_PRECISION_INPUT, chosen)
