"""scripts/repro/reflectrm_gpu.py, the ReflectRM GPU window: the registered rule's pieces (what is
contested, a majority tie's score, the primary pooled over seeds, the verdicts) and the whole
window at smoke scale on the CPU (the judge trained inside the command on checked judgments,
reflection rows and every question's arithmetic; the gate; the comparison seed after seed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from repro import judge_common as jc
from repro import reflectrm_gpu as rg


def test_a_row_is_contested_only_when_its_readable_votes_hold_both_verdicts() -> None:
    assert rg.contested([-1, 1, None])
    assert not rg.contested([1, 1, None, 1])
    assert not rg.contested([None, None])


def test_a_majority_tie_scores_a_fair_coin() -> None:
    assert rg.majority_score([-1, 1, -1, 1], label=1) == 0.5
    assert rg.majority_score([1, 1, -1], label=1) == 1.0
    assert rg.majority_score([1, -1, -1, None], label=1) == 0.0


def _row(pair: str, order: int, reflective: float, majority: float, hard: bool = True) -> dict:
    return {"query_id": f"{pair}/{order}", "pair": pair, "contested": hard,
            "reflective_score": reflective, "majority_score": majority}  # fmt: skip


def test_the_primary_pools_contested_rows_over_seeds_and_keeps_pairs_together() -> None:
    # reflection right where the majority is wrong on 3 of 4 contested pairs, every seed;
    # uncontested rows (here: majority right, reflection wrong) never count
    seed = [_row(f"p{i}", o, 1.0 if i < 3 else 0.0, 0.0) for i in range(4) for o in (0, 1)]
    seed += [_row("easy", 0, 0.0, 1.0, hard=False)]
    result = rg.primary({"0": seed, "1": seed, "2": seed})
    interval = result["reflective_minus_majority"]
    assert result["contested_rows"] == 24 and result["contested_pairs"] == 4
    assert interval["mean"] == pytest.approx(0.75)
    assert 0.0 < interval["low"] <= 0.75 <= interval["high"] <= 1.0
    assert interval["interval_method"] == "pair-clustered bootstrap"
    assert result["per_seed_differences"] == [0.75, 0.75, 0.75]
    # identical seeds: the t-interval is a point, and it excludes 0 on the expected side
    assert interval["t_low"] == interval["t_high"] == pytest.approx(0.75) and result["shown"]


def test_the_primary_is_not_shown_when_reflection_loses_or_ties() -> None:
    rows = [_row(f"p{i}", o, float(i % 2), float((i + 1) % 2)) for i in range(6) for o in (0, 1)]
    result = rg.primary({"0": rows, "1": rows})
    assert result["reflective_minus_majority"]["mean"] == pytest.approx(0.0)
    assert not result["shown"]
    # the t beside the bootstrap is the t-interval of the per-seed differences
    spread = [_row("p0", o, r, 0.0) for o, r in ((0, 1.0), (1, 0.0))]
    both = rg.primary({"0": spread, "1": [_row("p0", 0, 1.0, 0.0), _row("p0", 1, 1.0, 0.0)]})
    assert both["per_seed_differences"] == [0.5, 1.0]
    half = 12.706 * 0.3536 / 2**0.5  # t(0.975, 1) x sd / sqrt(n)
    assert both["reflective_minus_majority"]["t_low"] == pytest.approx(0.75 - half, abs=1e-3)


def test_the_registered_verdicts() -> None:
    s = rg.REGIMES["gpu"]
    fails, passes = {"passes": False}, {"passes": True}
    assert "does not read the analyses" in rg.verdict(fails, None, s)
    assert "no seed" in rg.verdict(passes, None, s)
    few = {"contested_rows": s["min_contested"] - 1, "shown": True}
    assert "fewer than 48 contested rows" in rg.verdict(passes, few, s)
    enough = {"contested_rows": s["min_contested"], "shown": False}
    assert rg.verdict(passes, enough, s) == "not shown"
    assert rg.verdict(passes, {**enough, "shown": True}, s) == "shown"


def test_the_gpu_regime_teaches_every_question_and_fits_its_targets() -> None:
    s = rg.REGIMES["gpu"]
    warm = jc.make_pools(s["pools"], seed=0, max_value=s["max_value"])["warm"]
    rows = jc.warm_rows(warm, s)
    facts = [r for r in rows if r["prompt"].startswith("What is")]
    assert len(facts) == 20 * 20 * 2 * s["fact_copies"]
    assert sum("Critique 1 checks" in r["response"] for r in rows) == len(warm) // 2
    assert jc.check_new_tokens(rows, s) <= s["max_new_tokens"]  # the longest target fits


def test_the_smoke_window_trains_the_judge_then_gates_and_compares(tmp_path: Path) -> None:
    out, work = tmp_path / "r.json", str(tmp_path / "w")
    spent = rg.main(["--regime", "smoke", "--work", work, "--out", str(out), "--budget-s", "0"])
    assert spent["seeds"] == {} and "no seed of the comparison finished" in spent["verdict"]
    assert spent["sft_seconds"] > 0  # trained inside the command
    assert json.loads(out.read_text())["gate"]["prompts"] == 8  # the gate's record is kept
    record = rg.main(["--regime", "smoke", "--work", work, "--out", str(out)])
    assert record["sft_seconds"] == 0.0  # the judge trained above is reused
    saved = json.loads(out.read_text())
    assert saved["verdict"] == record["verdict"] and saved["commit"]
    gate = saved["gate"]
    assert gate["prompts"] == len(gate["rows"]) == 8  # 4 development pairs x 2 orders
    assert set(saved["seeds"]) == {"0", "1"}  # the comparison ran seed after seed
    for rows in saved["seeds"].values():
        assert len(rows) == 16  # 8 reserved pairs x 2 orders, each with its votes
        assert all(len(r["votes"]) == 2 for r in rows)
    assert "primary" in saved and saved["verdict"].startswith(("smoke", "not testable"))
