"""The settings of the mismatch correction's four modes (TRL 1.16's
``vllm_importance_sampling_mode``) and of GSPO's TRL form: accepted combinations, and refusals
that name the dotted key and the fix."""

import pytest

from lit_rlhf.settings import MismatchSettings, PolicyLossSettings

GSPO = dict(policy_loss="gspo", loss_agg="seq_mean_token_mean")


@pytest.mark.parametrize(
    "fields",
    [
        dict(correction="tis", level="token", cap=3.0, floor=0.2),  # token_truncate
        dict(correction="tis", level="sequence", cap=3.0),  # sequence_truncate
        dict(correction="mask", level="token", low=0.0, high=3.0),  # token_mask
        dict(correction="mask", level="sequence", low=0.0, high=3.0),  # sequence_mask
    ],
)
def test_each_mode_is_accepted(fields):
    settings = MismatchSettings(**fields)
    for name, value in fields.items():
        assert getattr(settings, name) == value


def test_the_defaults_are_token_level_without_a_floor():
    settings = MismatchSettings()
    assert (settings.level, settings.cap, settings.floor) == ("token", 2.0, 0.0)
    assert PolicyLossSettings().gspo_weighting == "token"


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(floor=1.0), r"mismatch\.floor=1\.0 must be in \[0, 1\).*Fix: set "
         r"model\.init_args\.mismatch\.floor in that range"),
        (dict(floor=-0.1), r"mismatch\.floor=-0\.1 must be in \[0, 1\)"),
        (dict(floor=float("nan")), r"mismatch\.floor=nan must be in \[0, 1\)"),
        (dict(level="row"), r"mismatch\.level='row' is not one of \['token', 'sequence'\]\. "
         r"Fix: set model\.init_args\.mismatch\.level to one of them"),
    ],
)  # fmt: skip
def test_bad_mismatch_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        MismatchSettings(**fields)


def test_gspo_weighting_sequence_is_accepted_with_gspo():
    assert PolicyLossSettings(gspo_weighting="sequence", **GSPO).gspo_weighting == "sequence"


def test_gspo_weighting_sequence_without_gspo_is_refused():
    with pytest.raises(
        ValueError,
        match=r"loss\.gspo_weighting='sequence' .* loss\.policy_loss='ppo' has no sequence "
        r"ratio\. Fix: set loss\.policy_loss: gspo",
    ):
        PolicyLossSettings(gspo_weighting="sequence")


def test_an_unknown_gspo_weighting_is_refused():
    with pytest.raises(ValueError, match=r"loss\.gspo_weighting='mean' is not one of"):
        PolicyLossSettings(gspo_weighting="mean", **GSPO)
