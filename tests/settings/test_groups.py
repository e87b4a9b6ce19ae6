"""The settings groups: each validates itself with a dotted key, a dict merges onto a module's
default, unknown keys are named with the closest field, and the flat names of before the groups
are refused from Python and regrouped when an old checkpoint is read."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from lit_rlhf.settings import (
    KLSettings,
    LoRASettings,
    OptimSettings,
    PolicyLossSettings,
    PrecisionSettings,
    RolloutSettings,
    SettingsGroup,
    flat_map,
    is_flat,
    refuse_flat_arguments,
    regroup_flat,
    store_groups,
)

_OPTIM = OptimSettings(lr=1e-6, micro_batch_size=None)


@refuse_flat_arguments
class Grouped:
    """A class that takes groups the way the modules do."""

    def __init__(
        self,
        model: str = "m",
        optim: OptimSettings = _OPTIM,
        loss: PolicyLossSettings = PolicyLossSettings(),
        lora: LoRASettings = LoRASettings(),
    ) -> None:
        self.optim = OptimSettings.coerce(optim, _OPTIM)
        self.loss = PolicyLossSettings.coerce(loss)
        self.lora = LoRASettings.coerce(lora)
        self.hparams: dict[str, Any] = {"model": model}
        store_groups(self, {"optim": self.optim, "loss": self.loss, "lora": self.lora})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: OptimSettings(lr=-1.0), r"optim\.lr=-1\.0 must be > 0 and finite"),
        (lambda: OptimSettings(lr_schedule="exp"), r"optim\.lr_schedule='exp' is not one of"),
        (lambda: OptimSettings(min_lr_ratio=0.1), r"optim\.min_lr_ratio=0\.1 .* do nothing"),
        (lambda: PolicyLossSettings(clip_low=1.5), r"loss\.clip_low=1\.5 must be in \(0, 1\)"),
        (lambda: KLSettings(coef=-0.1), r"kl\.coef=-0\.1 must be >= 0"),
        (lambda: LoRASettings(quantize="4bit"), r"lora\.quantize='4bit' .* lora\.rank > 0"),
        (lambda: RolloutSettings(dynamic_sampling=True, samples_per_prompt=1), "never differs"),
        (lambda: PolicyLossSettings(policy_loss="gspo"), r"loss\.loss_agg: seq_mean_token_mean"),
    ],
)
def test_a_group_refuses_a_bad_value_with_its_dotted_key(build, message) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_the_fix_names_the_full_config_key() -> None:
    with pytest.raises(ValueError, match=r"Fix: set model\.init_args\.optim\.lr in that range"):
        OptimSettings(lr=0.0)


def test_a_dict_merges_onto_the_module_default_and_an_instance_is_kept() -> None:
    merged = OptimSettings.coerce({"lr_schedule": "cosine"}, _OPTIM)
    assert (merged.lr, merged.micro_batch_size, merged.lr_schedule) == (1e-6, None, "cosine")
    given = OptimSettings(lr=3e-4)
    assert OptimSettings.coerce(given, _OPTIM) is given
    assert OptimSettings.coerce(None, _OPTIM) is _OPTIM


def test_an_unknown_key_is_named_with_the_closest_field() -> None:
    with pytest.raises(ValueError, match=r"Group 'optim' does not accept option 'lr_shedule'\. "
                                         r"Did you mean optim\.lr_schedule\?"):  # fmt: skip
        OptimSettings.coerce({"lr_shedule": "cosine"})
    with pytest.raises(TypeError, match="optim must be a OptimSettings or a dict"):
        OptimSettings.coerce(0.1)  # type: ignore[arg-type]


def test_hparams_hold_plain_dicts_of_each_group() -> None:
    built = Grouped(optim=OptimSettings(lr=2e-5), loss={"clip_high": 0.28})
    assert built.hparams["optim"] == {
        **dataclasses.asdict(_OPTIM),
        "lr": 2e-5,
        "micro_batch_size": 8,
    }
    assert built.hparams["loss"]["clip_high"] == 0.28  # type: ignore[index]
    rebuilt = Grouped(**built.hparams)  # as load_from_checkpoint does
    assert rebuilt.optim == built.optim and rebuilt.loss == built.loss


def test_a_flat_keyword_is_refused_in_one_line_naming_its_group() -> None:
    with pytest.raises(TypeError) as info:
        Grouped(clip_low=0.1)
    assert str(info.value).count("\n") == 0
    assert "it is now loss.clip_low" in str(info.value)
    assert "loss=PolicyLossSettings(clip_low=...)" in str(info.value)
    with pytest.raises(TypeError, match=r"it is now lora\.rank"):
        Grouped(lora_rank=8)


def test_an_old_flat_checkpoint_is_regrouped() -> None:
    old = {"model": "m", "lr": 3e-4, "lr_schedule": "linear", "clip_low": 0.1, "lora_rank": 4}
    assert is_flat(Grouped, old)
    new = regroup_flat(Grouped, old)
    assert new == {
        "model": "m",
        "optim": {"lr": 3e-4, "lr_schedule": "linear"},
        "loss": {"clip_low": 0.1},
        "lora": {"rank": 4},
    }
    assert not is_flat(Grouped, new)
    built = Grouped(**new)
    assert (built.optim.lr, built.optim.micro_batch_size, built.lora.rank) == (3e-4, None, 4)
    assert flat_map(Grouped)["lora_alpha"] == "lora.alpha"


def test_every_group_is_frozen_documented_and_keyed() -> None:
    groups = [OptimSettings, PrecisionSettings, LoRASettings, PolicyLossSettings, KLSettings]
    for group in groups:
        assert issubclass(group, SettingsGroup) and group.GROUP
        with pytest.raises(dataclasses.FrozenInstanceError):
            group().__setattr__(dataclasses.fields(group)[0].name, None)
