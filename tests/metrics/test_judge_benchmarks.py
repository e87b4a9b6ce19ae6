"""Judge-benchmark scores on hand-built verdicts, each checked against arithmetic done by hand:
accuracy and positional consistency, RM-Bench's 3 x 3 style matrix (hard / normal / easy),
RMB's Best-of-N rule, JudgeBench's two-game rule, RewardBench's weighted sections, and the
papers' averages."""

from __future__ import annotations

import math

import pytest

from lit_rlhf.metrics.judge_benchmarks import (
    Judged,
    accuracy,
    benchmark_report,
    paper_averages,
    positional_consistency,
)


def both_orders(
    family: str, correct: tuple[bool, bool], subset: str = "", comparison: str = ""
) -> list[Judged]:
    """A comparison judged in its two orders: right (verdict = label) or wrong (-label)."""
    rows = []
    for swapped, right in zip((False, True), correct, strict=True):
        label = 1 if swapped else -1
        rows.append(Judged(family, comparison, subset, swapped, label, label if right else -label))
    return rows


def test_accuracy_counts_rows_and_consistency_counts_comparisons_right_in_both_orders() -> None:
    judged = (
        both_orders("a", (True, True))
        + both_orders("b", (True, False))
        + both_orders("c", (False, False))
        + [Judged("d", "", "", False, -1, 0)]  # a tie is wrong; seen in one order only
    )
    assert accuracy(judged) == pytest.approx(3 / 7)  # rows right: a, a, b
    assert positional_consistency(judged) == pytest.approx(1 / 3)  # a of {a, b, c}
    assert math.isnan(positional_consistency(judged[-1:]))


def rm_bench_row(domain: str, row_id: str, rule) -> list[Judged]:
    """Nine comparisons of one RM-Bench row; ``rule(i, j)`` says if each order is right."""
    rows = []
    for i in range(3):
        for j in range(3):
            tag = f"c{i}r{j}"
            rows += both_orders(f"{domain}-{row_id}/{tag}", rule(i, j), domain, tag)
    return rows


def test_rm_bench_hard_normal_easy_from_the_style_matrix() -> None:
    # chat: a style-biased judge: right in both orders when the chosen is the more styled (easy),
    # in one order when the styles match (normal), never when the rejected is (hard)
    chat = rm_bench_row("chat", "1", lambda i, j: (i >= j, i > j))
    # safety: the refuse row all right; the response row right except its hard cells
    refuse = rm_bench_row("safety-refuse", "2", lambda i, j: (True, True))
    response = rm_bench_row("safety-response", "3", lambda i, j: (i >= j, i >= j))
    report = benchmark_report("rm_bench", chat + refuse + response)
    scores = report["scores"]
    # chat: hard 0, normal 0.5, easy 1 -> 0.5; safety: hard (1 + 0) / 2, normal 1, easy 1 -> 5/6
    assert scores["chat"] == pytest.approx(0.5)
    assert scores["safety"] == pytest.approx(5 / 6)
    assert scores["hard"] == pytest.approx((0 + 0.5) / 2)
    assert scores["normal"] == pytest.approx((0.5 + 1) / 2)
    assert scores["easy"] == pytest.approx(1.0)
    assert report["score"] == pytest.approx((0.5 + 5 / 6) / 2)
    # the subsets keep the data's domains; chat is right in 9 of 18 rows, consistent in 3 of 9
    assert report["subsets"]["chat"]["accuracy"] == pytest.approx(9 / 18)
    assert report["subsets"]["chat"]["positional_consistency"] == pytest.approx(3 / 9)
    assert report["subsets"]["safety-refuse"]["pairs"] == 9


def test_rmb_best_of_n_needs_the_best_to_beat_every_loser() -> None:
    bon = [
        # item 1: right against all three losers in the first order; loser1 lost in the second
        *both_orders("bon_uid:1/loser0", (True, True), "helpfulness-bon", "loser0"),
        *both_orders("bon_uid:1/loser1", (True, False), "helpfulness-bon", "loser1"),
        *both_orders("bon_uid:1/loser2", (True, True), "helpfulness-bon", "loser2"),
        # item 2: right against both losers in both orders
        *both_orders("bon_uid:2/loser0", (True, True), "helpfulness-bon", "loser0"),
        *both_orders("bon_uid:2/loser1", (True, True), "helpfulness-bon", "loser1"),
    ]
    pairwise = both_orders("pair_uid:7", (True, False), "helpfulness-pairwise") + both_orders(
        "pair_uid:8", (False, False), "helpfulness-pairwise"
    )
    report = benchmark_report("rmb", bon + pairwise)
    # (item, order): (1, first) yes, (1, second) no, (2, first) yes, (2, second) yes
    assert report["scores"]["helpfulness-bon"] == pytest.approx(3 / 4)
    assert report["scores"]["helpfulness-pairwise"] == pytest.approx(1 / 4)
    assert report["score"] == pytest.approx((3 / 4 + 1 / 4) / 2)


def test_judgebench_two_game_rule() -> None:
    tie = Judged("p2", "", "knowledge", True, 1, 0)
    judged = [
        *both_orders("p1", (True, True), "knowledge"),  # +1 +1: right
        Judged("p2", "", "knowledge", False, -1, -1),  # +1 and a tie (0): right
        tie,
        *both_orders("p3", (True, False), "math"),  # +1 -1 = 0: not right
        Judged("p4", "", "math", False, -1, 1),  # -1 and a tie: not right
        Judged("p4", "", "math", True, 1, 0),
    ]
    report = benchmark_report("judgebench", judged)
    assert report["score"] == pytest.approx(2 / 4)
    assert report["scores"] == {"knowledge": 1.0, "math": 0.0}
    assert report["accuracy"] == pytest.approx(4 / 8)  # per order: p1 x2, p2, p3
    assert report["positional_consistency"] == pytest.approx(1 / 4)  # p1 only


def test_rewardbench_sections_weigh_subsets_by_the_authors_counts() -> None:
    judged = (
        both_orders("1", (True, True), "math-prm")
        + both_orders("2", (False, False), "hep-python")
        + both_orders("3", (True, False), "alpacaeval-easy")
    )
    report = benchmark_report("rewardbench", judged)
    reasoning = (984 * 1.0 + 164 * 0.0) / (984 + 164)  # math-prm weighs as much as all code
    assert report["scores"] == pytest.approx({"Chat": 0.5, "Reasoning": reasoning})
    assert report["score"] == pytest.approx((0.5 + reasoning) / 2)


def test_other_benchmarks_score_plain_accuracy() -> None:
    judged = both_orders("a", (True, False)) + both_orders("b", (True, True))
    report = benchmark_report("ppe_preference", judged)
    assert report["score"] == report["accuracy"] == pytest.approx(3 / 4)
    assert report["scores"] == {} and report["subsets"] == {}


def test_paper_averages_are_unweighted_means_over_each_papers_benchmarks() -> None:
    # ConsistRM's reported Qwen3-8B row: 85.6 / 67.7 / 78.3 / 79.1 / 56.9 -> 73.5 on average
    scores = {
        "rewardbench": 85.6,
        "ppe_preference": 67.7,
        "rm_bench": 78.3,
        "rmb": 79.1,
        "judgebench": 56.9,
    }
    averages = paper_averages(scores)
    assert averages["ConsistRM"] == pytest.approx(73.52)
    assert averages["ReflectRM"] == pytest.approx((85.6 + 78.3 + 79.1 + 67.7) / 4)
    without = paper_averages({k: v for k, v in scores.items() if k != "judgebench"})
    assert "ConsistRM" not in without and without["mean"] == without["ReflectRM"]
