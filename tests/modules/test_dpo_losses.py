"""The DPO module's losses (``lit_rlhf.algos.preference``) against references written here from
the papers' equations in plain Python: DPO (arXiv 2305.18290 eq. 7) with cDPO's label smoothing,
IPO (arXiv 2310.12036 eq. 17) and SimPO (arXiv 2405.14734 eq. 6); hand-computed cases with the
arithmetic in comments, the gradient directions and values, and the settings refused."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.algos import dpo_loss, ipo_loss, simpo_loss


def neg_log_sigmoid(x: float) -> float:
    """-log sigmoid(x) = log(1 + e^-x)."""
    return math.log1p(math.exp(-x))


def dpo_reference(pc: float, pr: float, rc: float, rr: float, beta: float, eps: float) -> float:
    """Eq. 7: -log sigmoid(beta log pi(y_w)/ref(y_w) - beta log pi(y_l)/ref(y_l)); cDPO takes
    the label as flipped with probability eps."""
    z = beta * (pc - rc) - beta * (pr - rr)
    return (1 - eps) * neg_log_sigmoid(z) + eps * neg_log_sigmoid(-z)


def ipo_reference(pc: float, pr: float, rc: float, rr: float, tau: float) -> float:
    """Eq. 17: (h - 1 / (2 tau))^2, h = log [pi(y_w) ref(y_l) / (pi(y_l) ref(y_w))]."""
    h = (pc + rr) - (pr + rc)
    return (h - 1 / (2 * tau)) ** 2


def simpo_reference(
    sum_w: float, len_w: int, sum_l: float, len_l: int, beta: float, gamma: float
) -> float:
    """Eq. 6: -log sigmoid(beta / |y_w| log pi(y_w) - beta / |y_l| log pi(y_l) - gamma)."""
    return neg_log_sigmoid(beta / len_w * sum_w - beta / len_l * sum_l - gamma)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def test_dpo_by_hand() -> None:
    # log-ratios: chosen -10 - (-11) = 1, rejected -12 - (-11) = -1; beta * h = 0.1 * 2 = 0.2
    losses, rewards = dpo_loss(t(-10.0), t(-12.0), t(-11.0), t(-11.0), beta=0.1)
    assert losses.item() == pytest.approx(math.log(1 + math.exp(-0.2)))  # 0.598139
    assert losses.item() == pytest.approx(0.5981388693, abs=1e-9)
    assert (rewards.chosen.item(), rewards.rejected.item()) == pytest.approx((0.1, -0.1))
    assert not rewards.chosen.requires_grad and not rewards.rejected.requires_grad
    # cDPO, eps 0.1: 0.9 log(1 + e^-0.2) + 0.1 log(1 + e^0.2) = 0.598139 + 0.1 x 0.2 (since
    # log(1 + e^x) - log(1 + e^-x) = x)
    smoothed, _ = dpo_loss(t(-10.0), t(-12.0), t(-11.0), t(-11.0), beta=0.1, label_smoothing=0.1)
    assert smoothed.item() == pytest.approx(0.5981388693 + 0.02, abs=1e-9)


def test_ipo_by_hand() -> None:
    # h = 2 as above; tau 0.1: target 1 / 0.2 = 5, (2 - 5)^2 = 9; tau 0.25: target 2, loss 0
    losses, rewards = ipo_loss(t(-10.0, -10.0), t(-12.0, -12.0), t(-11.0, -11.0),
                               t(-11.0, -11.0), beta=0.1)  # fmt: skip
    assert losses.tolist() == pytest.approx([9.0, 9.0])
    assert rewards.chosen.tolist() == pytest.approx([0.1, 0.1])
    at_target, _ = ipo_loss(t(-10.0), t(-12.0), t(-11.0), t(-11.0), beta=0.25)
    assert at_target.item() == pytest.approx(0.0)


def test_simpo_by_hand() -> None:
    # averages: chosen -6 / 3 = -2, rejected -12 / 4 = -3; beta 2, gamma 0.5:
    # 2 x -2 - 2 x -3 - 0.5 = 1.5, loss log(1 + e^-1.5) = 0.201413
    losses, rewards = simpo_loss(t(-6.0 / 3), t(-12.0 / 4), beta=2.0, gamma=0.5)
    assert losses.item() == pytest.approx(0.2014132779, abs=1e-9)
    assert (rewards.chosen.item(), rewards.rejected.item()) == pytest.approx((-4.0, -6.0))


LOGP = st.floats(-60.0, -0.01)


@settings(max_examples=60, deadline=None)
@given(
    logps=st.lists(st.tuples(LOGP, LOGP, LOGP, LOGP), min_size=1, max_size=5),
    beta=st.floats(0.01, 5.0),
    eps=st.sampled_from([0.0, 0.1, 0.3, 0.49]),
)
def test_dpo_and_ipo_match_the_equations(
    logps: list[tuple[float, float, float, float]], beta: float, eps: float
) -> None:
    pc, pr, rc, rr = (torch.tensor(c, dtype=torch.float64) for c in zip(*logps, strict=True))
    dpo, _ = dpo_loss(pc, pr, rc, rr, beta=beta, label_smoothing=eps)
    ipo, _ = ipo_loss(pc, pr, rc, rr, beta=beta)
    assert dpo.tolist() == pytest.approx([dpo_reference(*row, beta, eps) for row in logps])
    assert ipo.tolist() == pytest.approx([ipo_reference(*row, beta) for row in logps])


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(LOGP, st.integers(1, 40), LOGP, st.integers(1, 40)), min_size=1, max_size=5
    ),
    beta=st.floats(0.1, 10.0),
    gamma=st.floats(0.0, 3.0),
)
def test_simpo_matches_the_equation(
    pairs: list[tuple[float, int, float, int]], beta: float, gamma: float
) -> None:
    chosen = torch.tensor([s / n for s, n, _, _ in pairs], dtype=torch.float64)
    rejected = torch.tensor([s / n for _, _, s, n in pairs], dtype=torch.float64)
    losses, _ = simpo_loss(chosen, rejected, beta=beta, gamma=gamma)
    assert losses.tolist() == pytest.approx([simpo_reference(*p, beta, gamma) for p in pairs])


def test_gradients_raise_the_chosen_and_lower_the_rejected() -> None:
    # DPO: d loss / d log pi(y_w) = -beta sigmoid(-beta h) = -0.1 sigmoid(-0.2) = -0.0450166
    pc, pr = t(-10.0), t(-12.0)
    dpo_loss(pc, pr, torch.tensor([-11.0]), torch.tensor([-11.0]), beta=0.1)[0].sum().backward()
    assert pc.grad is not None and pr.grad is not None
    sigmoid = 1 / (1 + math.exp(0.2))
    assert (pc.grad.item(), pr.grad.item()) == pytest.approx((-0.1 * sigmoid, 0.1 * sigmoid))
    # IPO below its target: d / d log pi(y_w) = 2 (h - 5) = -6
    pc, pr = t(-10.0), t(-12.0)
    ipo_loss(pc, pr, torch.tensor([-11.0]), torch.tensor([-11.0]), beta=0.1)[0].sum().backward()
    assert pc.grad is not None and pr.grad is not None
    assert (pc.grad.item(), pr.grad.item()) == pytest.approx((-6.0, 6.0))
    # SimPO: d / d avg log pi(y_w) = -beta sigmoid(-1.5) = -2 x 0.182426
    avg_w, avg_l = t(-2.0), t(-3.0)
    simpo_loss(avg_w, avg_l, beta=2.0, gamma=0.5)[0].sum().backward()
    assert avg_w.grad is not None and avg_l.grad is not None
    expected = 2.0 / (1 + math.exp(1.5))
    assert (avg_w.grad.item(), avg_l.grad.item()) == pytest.approx((-expected, expected))


def test_ipo_pushes_back_past_its_target_and_dpo_never_does() -> None:
    # h = 2 beyond IPO's target 1 / (2 x 1) = 0.5: the chosen log-prob is pulled down again
    pc = t(-10.0)
    ipo_loss(pc, t(-12.0), torch.tensor([-11.0]), torch.tensor([-11.0]), beta=1.0)[0].backward()
    assert pc.grad is not None and pc.grad.item() == pytest.approx(2 * (2.0 - 0.5))
    pc = t(-10.0)
    dpo_loss(pc, t(-12.0), torch.tensor([-11.0]), torch.tensor([-11.0]), beta=1.0)[0].backward()
    assert pc.grad is not None and pc.grad.item() < 0
    # with label smoothing, DPO's gradient also turns once beta h > log((1 - eps) / eps)
    pc = t(-1.0)
    dpo_loss(pc, t(-30.0), torch.tensor([-11.0]), torch.tensor([-11.0]), beta=1.0,
             label_smoothing=0.1)[0].backward()  # fmt: skip
    assert pc.grad is not None and pc.grad.item() > 0  # beta h = 29 > log 9


def test_settings_are_refused() -> None:
    one = torch.zeros(1)
    for beta in (0.0, -0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"beta=.* must be > 0 and finite"):
            dpo_loss(one, one, one, one, beta=beta)
        with pytest.raises(ValueError, match="beta="):
            ipo_loss(one, one, one, one, beta=beta)
        with pytest.raises(ValueError, match="beta="):
            simpo_loss(one, one, beta=beta, gamma=0.0)
    for eps in (0.5, -0.1, math.nan):
        with pytest.raises(ValueError, match=r"label_smoothing=.* must be in \[0, 0.5\)"):
            dpo_loss(one, one, one, one, beta=0.1, label_smoothing=eps)
    for gamma in (-0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"gamma=.* must be >= 0 and finite"):
            simpo_loss(one, one, beta=2.0, gamma=gamma)
    with pytest.raises(ValueError, match=r"\[B\] tensors of one shape"):
        dpo_loss(torch.zeros(2), one, one, one, beta=0.1)
    with pytest.raises(ValueError, match=r"\[B\] tensors of one shape"):
        simpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), beta=2.0, gamma=0.0)
