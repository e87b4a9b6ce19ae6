"""Every numeric setting of every module against its valid range (issue [3/5]): each value
outside the range is refused when the module is built, before any model loads, naming the
setting (a settings group's field by its dotted key, ``optim.lr``). ``RANGES`` is the table
docs/reliability.md shows ("Setting ranges"); a numeric setting a module gains without a row here
fails ``test_every_numeric_setting_has_a_range``."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from lit_rlhf.modules import (
    CompressorDecoderModule,
    DPOModule,
    GenerativeRewardModule,
    PPOModule,
    RewardModelModule,
    SFTModule,
)
from lit_rlhf.rewards import CountdownReward
from lit_rlhf.settings import group_params

NAN, INF = math.nan, math.inf
NONE_MODEL = "no/such-model"  # nothing loads while a module is built

# setting (a module argument, or "<group>.<field>" of a settings group) -> (valid range as the
# docs state it, values outside it)
RANGES: dict[str, tuple[str, list[Any]]] = {
    "rollout.samples_per_prompt": (">= 1 (>= 2 for grpo / rloo)", [0, -1]),
    "advantage.gamma": ("[0, 1]", [-0.1, 1.5, NAN]),
    "advantage.lam": ("[0, 1]", [-0.1, 1.5, NAN]),
    "update.ppo_epochs": (">= 1", [0]),
    "update.mini_batch_size": (">= 1, or null (the whole rollout)", [0]),
    "update.global_mini_batch_size": (">= 1 prompt across all processes, or null", [0]),
    "update.device_peak_flops": ("> 0 and finite FLOP/s, or null", [0, float("nan")]),
    "optim.micro_batch_size": (">= 1, or null where the module allows it", [0, -2]),
    "update.micro_batch_tokens": (">= 1 token, or null (padded micro-batches)", [0, -64]),
    "loss.clip_low": ("(0, 1)", [0.0, 1.0, NAN]),
    "loss.clip_high": ("> 0, finite", [0.0, -0.2, NAN, INF]),
    "loss.dual_clip": ("> 1, or null", [1.0, 0.5]),
    "critic.value_clip": ("> 0, or null", [0.0]),
    "critic.vf_coef": (">= 0", [-0.5, NAN]),
    "kl.coef": (">= 0, finite", [-0.1, NAN, INF]),
    "distill.coef": ("> 0, finite", [0.0, -1.0, NAN, INF]),
    "distill.task_reward_coef": (">= 0, finite", [-1.0, NAN, INF]),
    "distill.discount": ("[0, 1]", [-0.1, 1.5, NAN]),
    "distill.teacher_timeout_s": ("> 0, finite", [0.0, -1.0, NAN, INF]),
    "optim.lr": ("> 0, finite", [0.0, -1e-6, NAN, INF]),
    "critic.lr": ("> 0, finite", [0.0, -1e-5, NAN]),
    "optim.weight_decay": (">= 0, finite", [-0.1, NAN]),
    "optim.max_grad_norm": ("> 0, or null (no clipping)", [0.0, -1.0, NAN]),
    "optim.lr_warmup_steps": (">= 0", [-1]),
    "optim.lr_warmup_ratio": ("[0, 1)", [-0.1, 1.0, NAN]),
    "optim.min_lr_ratio": ("[0, 1]", [-0.1, 1.5, NAN]),
    "optim.lr_total_steps": (">= 1, or null (from the trainer)", [0, -5]),
    "optim.max_consecutive_skips": (">= 1", [0]),
    "eval.samples": (">= 1", [0]),
    "eval.pass_threshold": ("finite", [NAN, INF]),
    "update.seed": (">= 0", [-1]),
    "reward_fallback": ("finite", [NAN, INF]),
    "advantage.eps": (">= 0, finite", [-1e-6, NAN, INF]),
    "loss.loss_norm_length": (">= 1, or null (max_new_tokens)", [0, -4]),
    "mismatch.cap": (">= 1, finite", [0.5, NAN, INF]),
    "mismatch.floor": ("[0, 1)", [-0.1, 1.0, NAN]),
    "mismatch.low": ("[0, 1)", [-0.1, 1.0, NAN]),
    "mismatch.high": ("> 1, finite", [1.0, 0.5, NAN, INF]),
    "rollout.overlong_buffer": (">= 1 token, or null (no soft penalty)", [0, -3]),
    "rollout.overlong_penalty_factor": (">= 0, finite", [-1.0, NAN, INF]),
    "rollout.log_completions": (">= 0 rollout steps (0: off)", [-1, 1.5]),
    "rollout.dynamic_sampling_max_rounds": (">= 1", [0, -1]),
    "rollout.max_staleness": (">= 0 (0: on-policy)", [-1]),
    "judge.eval_samples": (">= 1", [0]),
    "margin": (">= 0, finite", [-0.5, NAN]),
    "max_length": (">= 2", [1, 0]),
    "compressor_layers": (">= 1, or null (the whole model)", [0]),
    "num_memory_tokens": (">= 1, or null (from compression_rate)", [0]),
    "compression_rate": (
        "> 0, and context_tokens / ceil(context_tokens / rate) == rate",
        [-2.0, 64.0, NAN],
    ),
    "context_tokens": (">= 1", [0]),
    "ae_weight": (">= 0, not both 0 with lm_weight", [-1.0, NAN]),
    "lm_weight": (">= 0, not both 0 with ae_weight", [-1.0, NAN]),
    "lora.rank": (">= 0 (0: no LoRA)", [-1]),
    "lora.alpha": ("> 0 (with lora.rank > 0)", [0]),
    "lora.dropout": ("[0, 1)", [1.0, -0.1]),
    "max_new_tokens": (">= 1, or null", [0]),
    "loss.beta": ("> 0, finite", [0.0, -0.1, NAN, INF]),
    "loss.label_smoothing": ("[0, 0.5)", [0.5, -0.1, NAN]),
    "loss.simpo_gamma": (">= 0, finite (loss.kind simpo only)", [-0.5, NAN, INF]),
    "env.max_turns": (">= 1", [0, -1]),
    "env.max_turn_tokens": (">= 1, or null (the engine's max_new_tokens)", [0]),
    "env.max_episode_tokens": (">= 2, or null (no limit)", [1, 0]),
    "env.step_timeout": ("> 0 seconds, finite", [0.0, -1.0, NAN, INF]),
    "env.budget_penalty": ("finite, or null (budget-cut episodes masked)", [NAN, INF]),
}

# what a module needs besides the setting under test, so that only that setting is wrong
MODULES: dict[type, dict[str, Any]] = {
    PPOModule: {"reward": CountdownReward(), "model": NONE_MODEL},
    GenerativeRewardModule: {"model": NONE_MODEL},
    RewardModelModule: {"model": NONE_MODEL},
    CompressorDecoderModule: {"compressor": NONE_MODEL, "decoder": NONE_MODEL},
    SFTModule: {"model": NONE_MODEL},
    DPOModule: {"model": NONE_MODEL},
}
# settings whose out-of-range value needs a companion setting to matter
COMPANIONS: dict[tuple[type, str], dict[str, Any]] = {
    (CompressorDecoderModule, "compression_rate"): {
        "num_memory_tokens": None,
        "context_tokens": 32,
    },
    (CompressorDecoderModule, "context_tokens"): {"num_memory_tokens": None, "compression_rate": 8},
    (CompressorDecoderModule, "lora.alpha"): {"lora.rank": 4},
    (CompressorDecoderModule, "lora.dropout"): {"lora.rank": 4},
    (DPOModule, "lora.alpha"): {"lora.rank": 4},
    (DPOModule, "loss.simpo_gamma"): {"loss.kind": "simpo"},
    (PPOModule, "lora.alpha"): {"lora.rank": 4},
    (GenerativeRewardModule, "lora.alpha"): {"lora.rank": 4},
}


def _numeric(hint: Any) -> bool:
    kinds = typing.get_args(hint) or (hint,)
    return hint is not bool and any(k in (int, float) for k in kinds)


def numeric_settings(cls: type) -> list[str]:
    """The module's numeric arguments, and each settings group's numeric fields as
    ``<group>.<field>`` (a field goes by its own name, whatever group class holds it)."""
    groups = group_params(cls)
    names = []
    for name, hint in typing.get_type_hints(cls.__init__).items():  # type: ignore[misc]
        if name in groups:
            fields = typing.get_type_hints(groups[name])
            names += [f"{name}.{f.name}" for f in dataclasses.fields(groups[name])
                      if _numeric(fields[f.name])]  # fmt: skip
        elif name != "return" and _numeric(hint):
            names.append(name)
    return names


def module_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """``{"lora.rank": 4, "model": m}`` -> ``{"lora": {"rank": 4}, "model": m}``."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        group, _, field = key.rpartition(".")
        if group:
            out.setdefault(group, {})[field] = value
        else:
            out[key] = value
    return out


CASES = [
    pytest.param(cls, name, bad, id=f"{cls.__name__}-{name}={bad}")
    for cls in MODULES
    for name in numeric_settings(cls)
    for bad in RANGES.get(name, ("", []))[1]
]


def test_every_numeric_setting_has_a_range() -> None:
    missing = [f"{c.__name__}.{n}" for c in MODULES for n in numeric_settings(c) if n not in RANGES]
    assert not missing, f"add these settings to RANGES (and docs/reliability.md): {missing}"
    assert len(CASES) >= 150


@pytest.mark.parametrize(("cls", "name", "bad"), CASES)
def test_a_value_outside_the_range_is_refused_when_built(cls: type, name: str, bad: Any) -> None:
    kwargs = module_kwargs({**MODULES[cls], **COMPANIONS.get((cls, name), {}), name: bad})
    with pytest.raises(ValueError, match=re.escape(name)):
        cls(**kwargs)


@pytest.mark.parametrize("cls", list(MODULES))
def test_the_defaults_are_in_range(cls: type) -> None:
    cls(**MODULES[cls])


def docs_table() -> str:
    """The markdown table of docs/reliability.md's "Setting ranges" section."""
    users: dict[str, list[str]] = {}
    for cls in MODULES:
        for name in numeric_settings(cls):
            users.setdefault(name, []).append(cls.__name__.removesuffix("Module"))
    lines = ["| setting | valid range | modules | refused in the test |", "|---|---|---|---|"]
    for name, (wanted, bad) in RANGES.items():
        shown = ", ".join(str(v) for v in bad)
        lines.append(f"| `{name}` | {wanted} | {', '.join(users.get(name, []))} | {shown} |")
    return "\n".join(lines)


def test_the_docs_show_this_table() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    assert docs_table() in docs, "regenerate: python -m tests.reliability.test_setting_ranges"


if __name__ == "__main__":
    print(docs_table())
