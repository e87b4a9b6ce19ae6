import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.algos import AdaptiveKLController, kl_penalty


def test_k1_k2_k3_hand_values():
    log_probs = torch.tensor([math.log(0.5), math.log(0.25)])
    ref_log_probs = torch.tensor([math.log(0.25), math.log(0.25)])
    # token 0: log-ratio logp - logref = log 2 = 0.693147
    #   k1 = 0.693147; k2 = 0.5 * 0.693147^2 = 0.240227
    #   k3 = exp(-log 2) - (-log 2) - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # token 1: identical distributions -> all estimators 0
    torch.testing.assert_close(
        kl_penalty(log_probs, ref_log_probs, estimator="k1"), torch.tensor([0.693147, 0.0])
    )
    torch.testing.assert_close(
        kl_penalty(log_probs, ref_log_probs, estimator="k2"), torch.tensor([0.240227, 0.0])
    )
    torch.testing.assert_close(
        kl_penalty(log_probs, ref_log_probs, estimator="k3"), torch.tensor([0.193147, 0.0])
    )


@settings(max_examples=100, deadline=None)
@given(
    log_p=st.floats(-60.0, 0.0),
    log_ref=st.floats(-60.0, 0.0),
)
def test_k3_is_nonnegative_and_finite(log_p, log_ref):
    k3 = kl_penalty(torch.tensor([log_p]), torch.tensor([log_ref]), estimator="k3")
    assert torch.isfinite(k3).all()
    assert k3.item() >= 0.0


def test_k3_clamps_an_impossible_reference_token():
    # reference probability 0: log-ratio logref - logp = -inf is clamped to -20,
    # k3 = exp(-20) + 20 - 1 ~ 19
    k3 = kl_penalty(torch.tensor([-1.0]), torch.tensor([-math.inf]), estimator="k3")
    assert k3.item() == pytest.approx(19.0, abs=1e-6)


def test_kl_penalty_gradient_flows_and_unknown_estimator_raises():
    log_probs = torch.tensor([-1.0, -2.0], requires_grad=True)
    kl_penalty(log_probs, torch.tensor([-1.5, -1.5]), estimator="k3").sum().backward()
    assert log_probs.grad is not None and (log_probs.grad != 0).all()
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(log_probs, log_probs, estimator="k4")  # type: ignore[arg-type]


def test_adaptive_kl_controller_hand_case():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    # KL 9: error (9 - 6) / 6 = 0.5, clipped to 0.2; coef *= 1 + 0.2 * 256 / 10000 = 1.00512
    assert ctl.update(9.0, n_steps=256) == pytest.approx(0.1 * 1.00512)
    # KL 5.4: error (5.4 - 6) / 6 = -0.1 (inside the clip); coef *= 1 - 0.1 * 0.0256 = 0.99744
    assert ctl.update(5.4, n_steps=256) == pytest.approx(0.1 * 1.00512 * 0.99744)
    # KL 0: error -1, clipped to -0.2; coef *= 1 - 0.2 * 0.0256 = 0.99488
    ctl.update(0.0, n_steps=256)
    assert ctl.value == pytest.approx(0.1 * 1.00512 * 0.99744 * 0.99488)


def test_adaptive_kl_controller_state_dict_round_trip():
    ctl = AdaptiveKLController(0.2, target=1.0, horizon=100)
    ctl.update(3.0, n_steps=10)
    restored = AdaptiveKLController(0.2, target=1.0, horizon=100)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value
    assert restored.update(0.5, n_steps=10) == ctl.update(0.5, n_steps=10)


@pytest.mark.parametrize(
    ("init", "target", "horizon", "match"),
    [(-0.1, 1.0, 10, "init_kl_coef"), (0.1, 0.0, 10, "target"), (0.1, 1.0, 0, "horizon")],
)
def test_adaptive_kl_controller_validates_arguments(init, target, horizon, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveKLController(init, target=target, horizon=horizon)
