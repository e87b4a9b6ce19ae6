"""scripts/repro/intervals.py and scripts/repro/power.py (issue 40, item 4): intervals that stay
in a bounded metric's range, the exact binomial interval, the pair-clustered bootstrap of the
judges against the seed-only interval, the seeds a paired t-test needs (checked by simulation),
and the registered rule for collapsed runs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

from repro import intervals as iv  # noqa: E402
from repro import power  # noqa: E402
from repro.common import summarize, verdict  # noqa: E402


def test_percentile_bootstrap_stays_in_the_range_on_skewed_three_seeds() -> None:
    t = iv.Interval.of([0.0, 0.0, 1.0])
    assert t.low < 0 and t.high > 1  # the t-interval leaves [0, 1]
    for values in ([0.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.05, 0.9]):
        boot = iv.bootstrap_interval(values, 0.0, 1.0)
        assert 0.0 <= boot.low <= boot.mean <= boot.high <= 1.0
        assert boot.as_dict()["interval_method"] == "percentile bootstrap"
    by_seed = {s: {"pass@1": v} for s, v in enumerate([0.0, 0.0, 1.0])}
    arm = iv.arm_interval(by_seed, "pass@1", iv.bounded(0.0, 1.0))
    assert arm.low == 0.0 and arm.high == 1.0 and arm.mean == pytest.approx(1 / 3)


def test_exact_binomial_of_57_out_of_96() -> None:
    ci = iv.binomial_interval(57, 96)
    # Clopper-Pearson: the 2.5 % / 97.5 % beta quantiles Beta(57, 40) and Beta(58, 39)
    from scipy.stats import beta

    assert ci.low == pytest.approx(beta.ppf(0.025, 57, 40), abs=1e-9)
    assert ci.high == pytest.approx(beta.ppf(0.975, 58, 39), abs=1e-9)
    assert (round(ci.low, 4), round(ci.high, 4)) == (0.4887, 0.6929)
    # a count metric pools the seeds: 19/32 on each of 3 seeds is 57/96
    by_seed = {s: {"right": 19 / 32, "n": 32} for s in range(3)}
    pooled = iv.arm_interval(by_seed, "right", iv.count("n"))
    assert (pooled.low, pooled.high) == (ci.low, ci.high)


def _anchor_case() -> tuple[dict, dict]:
    rows = [f"row{i}" for i in range(96)]
    anchor = {seed: {r: float(i < 57) for i, r in enumerate(rows)} for seed in range(3)}
    chance = {seed: dict.fromkeys(rows, 0.5) for seed in range(3)}
    return anchor, chance


def test_clustered_bootstrap_does_not_take_seed_repetition_for_evidence() -> None:
    # ReflectRM's anchor case: the same 57 of 96 rows right on every seed, against chance
    anchor, chance = _anchor_case()
    seed_only = iv.Interval.of([57 / 96 - 0.5] * 3)
    assert seed_only.excludes_zero()  # zero spread over seeds: [0.094, 0.094]
    clustered = iv.clustered_difference(anchor, chance)
    assert clustered.mean == pytest.approx(57 / 96 - 0.5)
    assert clustered.high - clustered.low > 0.15 > seed_only.high - seed_only.low
    assert not clustered.excludes_zero()
    assert verdict(clustered, +1) == "not shown" and verdict(seed_only, +1) == "reproduced"
    # pairs as clusters (both orders of a pair resampled together): no narrower here
    families = {r: f"pair{int(r[3:]) // 2}" for r in anchor[0]}
    paired = iv.clustered_difference(anchor, chance, families)
    assert paired.high - paired.low >= clustered.high - clustered.low - 0.02


def test_judge_rows_kind_reads_per_row_outputs_in_the_figures() -> None:
    anchor, chance = _anchor_case()

    def figures(outcomes: dict) -> dict:
        return {s: {"accuracy": sum(o.values()) / len(o),
                    "rows": [{"id": r, "right": v == 1.0, "family": r} for r, v in o.items()]}
                for s, o in outcomes.items()}  # fmt: skip

    half = {s: {r: float(i % 2 == 0) for i, r in enumerate(o)} for s, o in chance.items()}
    runs = {"anchor": figures(anchor), "sample": figures(half)}
    diff = iv.difference(runs, "accuracy", "anchor", "sample", iv.judge_rows())
    assert diff.method == "pair-clustered bootstrap" and diff.n == 3
    assert diff.mean == pytest.approx(57 / 96 - 0.5)
    arm = iv.arm_interval(runs["anchor"], "accuracy", iv.judge_rows())
    assert arm.low < 57 / 96 < arm.high and arm.low >= 0 and arm.high <= 1


def _simulated_seeds(d: float, target: float = 0.8, sims: int = 20000) -> int:
    """The smallest n whose simulated paired t-test (normal differences of mean d, sd 1)
    rejects at 0.05 two-sided in at least ``target`` of ``sims`` runs."""
    from scipy.stats import t as student

    rng = np.random.default_rng(1234)
    for n in range(2, 60):
        x = rng.normal(d, 1.0, size=(sims, n))
        tstat = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
        if np.mean(np.abs(tstat) > student.ppf(0.975, n - 1)) >= target:
            return n
    raise AssertionError("no n below 60")


@pytest.mark.parametrize(  # the last: d = 5.4, where scipy's nct gave NaN for n = 3-5
    ("sd", "effect"), [(1.0, 1.0), (0.04, 0.05), (0.1, 0.06), (0.011, 0.0599)]
)
def test_seeds_needed_matches_a_simulation(sd: float, effect: float) -> None:
    found = power.seeds_needed(sd, effect, ceiling=100)
    assert found.reached and found.power >= 0.8
    assert abs(found.seeds - _simulated_seeds(effect / sd)) <= 1
    assert power.seeds_needed(1.0, 1.0).seeds == 10  # d = 1: 10 pairs (power 0.80)


def test_seeds_needed_is_capped_and_the_cli_prints_it(capsys) -> None:
    capped = power.seeds_needed(0.05, 0.02, ceiling=10)
    assert capped.seeds == 10 and not capped.reached and capped.power < 0.8
    assert power.main(["--sd", "1", "--effect", "1"]) == 10
    assert capsys.readouterr().out.strip() == "10"
    power.main(["--sd", "0.05", "--effect", "0.02", "--ceiling", "10"])
    assert "not testable" in capsys.readouterr().out
    with pytest.raises(ValueError, match="effect of 0"):
        power.seeds_needed(1.0, 0.0)


def test_collapsed_runs_count_as_the_worst_value_and_are_never_dropped() -> None:
    acc = iv.bounded(0.0, 1.0)  # higher is better: the worst is 0
    values = [0.8, math.nan, math.inf, 0.7, None]
    assert iv.apply_collapse_rule(values, acc) == [0.8, 0.0, 0.0, 0.7]
    flagged = iv.apply_collapse_rule([0.8, 0.9], acc, [False, True])
    assert flagged == [0.8, 0.0]
    assert iv.apply_collapse_rule([0.2, math.nan], iv.bounded(0, 1, worst=1.0)) == [0.2, 1.0]
    nan_rule = iv.apply_collapse_rule([1.0, math.nan], iv.unbounded())
    assert nan_rule[0] == 1.0 and math.isnan(nan_rule[1])
    runs = {"t": {0: {"m": 0.9}, 1: {"m": 0.9, "collapsed": True}, 2: {"m": 0.8}},
            "b": {0: {"m": 0.5}, 1: {"m": 0.5}, 2: {"m": 0.5}}}  # fmt: skip
    diff = iv.difference(runs, "m", "t", "b", acc)
    assert diff.n == 3 and diff.mean == pytest.approx((0.4 - 0.5 + 0.3) / 3)
    assert iv.arm_interval(runs["t"], "m", acc).mean == pytest.approx(1.7 / 3)
    # an unbounded metric with no worst: a collapsed seed makes the difference undefined
    assert math.isnan(iv.difference(runs, "m", "t", "b", iv.unbounded()).mean)


def test_verdict_on_a_seed_bootstrap_also_needs_the_t_interval() -> None:
    # three positive seeds: the percentile interval is within [min, max], so excludes 0; the
    # t-interval beside it does not, and the verdict follows it
    diff = iv.seed_difference([0.01, 0.2, 0.02], iv.bounded(0.0, 1.0))
    assert diff.low > 0 and diff.t_low is not None and diff.t_low < 0
    assert verdict(diff, +1) == "not shown"
    steady = iv.seed_difference([0.10, 0.11, 0.12], iv.bounded(0.0, 1.0))
    assert verdict(steady, +1) == "reproduced"


def test_summarize_draws_each_metric_as_its_kind() -> None:
    from repro.common import Paper, Primary

    class Fake(Paper):
        name, arms = "fake", ("a", "b")
        primary = Primary("acc", "a", "b", +1)
        table_metrics = ("acc", "loss")
        metric_kinds = {"acc": iv.bounded(0.0, 1.0)}  # noqa: RUF012

    runs = {"a": {s: {"acc": v, "loss": 2.0 + s} for s, v in enumerate([0.0, 0.0, 1.0])},
            "b": {s: {"acc": 0.5, "loss": 1.0} for s in range(3)}}  # fmt: skip
    summary = summarize(Fake(), runs, {"go": True})
    assert summary["arms"]["a"]["acc"]["interval_method"] == "percentile bootstrap"
    assert summary["arms"]["a"]["acc"]["low"] >= 0.0
    assert summary["arms"]["a"]["loss"]["interval_method"] == "t"
    primary = summary["primary"]["difference"]
    assert primary["interval_method"] == "percentile bootstrap" and "t_low" in primary
    assert summary["primary"]["verdict"] == "not shown"


def test_a_figure_an_arm_does_not_measure_is_left_out_not_scored_worst() -> None:
    # ConsistRM's rft arm has no pseudo-labels (NaN): declared not measured, it is "n/a" in its
    # row and in its difference; the same NaN in an arm that measures it is a collapse (worst)
    from repro.common import Paper, Primary, results_markdown

    class Fake(Paper):
        name, arms = "fake", ("gold", "free", "base")
        primary = Primary("acc", "free", "base", +1)
        table_metrics = ("acc", "pseudo")
        metric_kinds = {"acc": iv.bounded(0.0, 1.0), "pseudo": iv.bounded(0.0, 1.0)}  # noqa: RUF012
        not_measured = {"gold": ("pseudo",)}  # noqa: RUF012

    nan = float("nan")
    runs = {"gold": {0: {"acc": 0.8, "pseudo": nan}},
            "free": {0: {"acc": 0.7, "pseudo": nan}},
            "base": {0: {"acc": 0.5, "pseudo": 0.6}}}  # fmt: skip
    summary = summarize(Fake(), runs, {"go": True})
    assert "pseudo" not in summary["arms"]["gold"]
    assert summary["arms"]["free"]["pseudo"]["mean"] == 0.0  # collapsed: the worst value
    assert math.isnan(summary["differences"]["gold - base"]["pseudo"]["mean"])
    assert summary["differences"]["free - base"]["pseudo"]["mean"] == pytest.approx(-0.6)
    table = results_markdown(Fake(), summary, {"go": True}, [0])
    assert "| gold | 0.800 (1 seed) | n/a |" in table


def test_a_pooled_judge_interval_carries_the_per_seed_t_interval_beside_it() -> None:
    rows = [f"r{i}" for i in range(8)]
    clusters = {r: f"pair{i // 2}" for i, r in enumerate(rows)}
    base = {s: dict.fromkeys(rows, 0.0) for s in (0, 1)}
    # seed 0: 6 of 8 rows right, seed 1: 2 of 8: the pooled bootstrap may exclude 0, the
    # t-interval over the two per-seed differences (0.75, 0.25; df 1) cannot
    treat = {0: {r: float(i < 6) for i, r in enumerate(rows)},
             1: {r: float(i < 2) for i, r in enumerate(rows)}}  # fmt: skip
    diff = iv.clustered_difference(treat, base, clusters)
    t = iv.Interval.of([0.75, 0.25])
    assert (diff.t_low, diff.t_high) == pytest.approx((t.low, t.high))
    assert diff.low > 0 and not diff.excludes_zero() and verdict(diff, +1) == "not shown"
    one = iv.clustered_difference({0: treat[0]}, {0: base[0]}, clusters)
    assert one.t_low is None  # one seed: no t-interval


def test_a_presets_seed_count_and_positive_control_decide_the_verdict() -> None:
    from repro.common import Paper, Preset, Primary

    class Fake(Paper):
        name, arms = "fake", ("gold", "free", "base")
        primary = Primary("acc", "free", "base", +1)
        table_metrics = ("acc",)

    def runs(gold: list[float] | None, seeds: int = 3) -> dict:
        out = {"free": {s: {"acc": 0.8 + 0.01 * s} for s in range(seeds)},
               "base": {s: {"acc": 0.5} for s in range(seeds)}}  # fmt: skip
        if gold is not None:
            out["gold"] = {s: {"acc": g} for s, g in enumerate(gold[:seeds])}
        return out

    preset = Preset("p", (0, 1, 2), 1, verdict_seeds=3, control=("gold", "base"))
    plain = Preset("q", (0, 1, 2), 1)
    go = {"go": True}
    assert summarize(Fake(), runs([0.9, 0.91, 0.92]), go, plain)["primary"]["verdict"] == (
        "reproduced"
    )
    early = summarize(Fake(), runs([0.9, 0.91], 2), go, preset)
    assert early["primary"]["verdict"] == "too few seeds (the rule registered 3)"
    assert early["control"]["n"] == 2  # the control is recorded before the seeds are in
    assert "did not run" in summarize(Fake(), runs(None), go, preset)["primary"]["verdict"]
    flat = summarize(Fake(), runs([0.4, 0.6, 0.5]), go, preset)  # the control straddles 0
    assert flat["primary"]["verdict"].startswith("not testable") and flat["control"]["n"] == 3
    moved = summarize(Fake(), runs([0.9, 0.91, 0.92]), go, preset)
    assert moved["primary"]["verdict"] == "reproduced" and moved["control"]["low"] > 0
