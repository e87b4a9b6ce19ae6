"""scripts/repro/compression_planted.py: the planting rows, the held-out fact sentences kept
apart from training, the overwrite margin read at the value slot, the gates, and the whole run at
smoke scale, cached."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from repro import compression_planted as cp


def test_planted_rows_assert_the_prior_and_the_twin_spreads_the_values() -> None:
    items = cp.fact_items(60, cp.PLANT_SEED)
    planted = cp.plant_rows(items, "planted", 0)
    twin = cp.plant_rows(items, "twin", 0)
    assert sorted(r["prompt"] for r in planted) == sorted(r["prompt"] for r in twin)
    priors = {i["stem"]: f" {i['prior']}." for i in items}
    assert all(r["response"] == priors[r["prompt"]] for r in planted)
    # the twin: the subject's prior is no more frequent than its other values
    share = sum(r["response"] == priors[r["prompt"]] for r in twin) / len(twin)
    assert share < 0.5
    for subject, values in cp.subject_values().items():
        assert len(values) >= 2, subject  # the prior and at least one counterfactual


def test_evaluation_sentences_never_train() -> None:
    evaluation = cp.fact_items(50, cp.EVAL_SEED)
    avoid = {i["sentence"] for i in evaluation}
    train = cp.fact_items(200, cp.TRAIN_SEED, avoid)
    assert not avoid & {i["sentence"] for i in train}
    assert len({i["sentence"] for i in evaluation}) == 50


def test_gates_and_verdict() -> None:
    def twin(gain: float, margins: list[float], lm: float) -> dict:
        return {"memory_gain": gain, "margins": margins, "lm_margins": [lm] * 3}

    run = {"planted": twin(0.9, [1.0, 2.0, 1.5], 3.0), "twin": twin(0.8, [0.0, 0.5, 0.2], 1.0)}
    got = cp.verdict({"0": run, "1": run})
    assert got["passes"] and got["verdict"] == "shown"
    assert got["per_fact"] == pytest.approx([1.0, 1.5, 1.3])
    weak = {**run, "twin": twin(0.3, [0.0, 0.5, 0.2], 1.0)}  # the twin does not carry
    assert cp.verdict({"0": weak})["verdict"] == "gate fails (read: shown)"
    unplanted = {**run, "planted": twin(0.9, [1.0, 2.0, 1.5], 1.5)}  # planting moved < 1 nat
    assert not cp.verdict({"0": unplanted})["passes"]


def test_smoke_end_to_end_and_cached(tmp_path: Path) -> None:
    args = ["--smoke", "--root", str(tmp_path / "runs"), "--out", str(tmp_path / "p.json")]
    record = cp.main(args)
    s = cp.settings(smoke=True)
    run = record["seeds"]["0"]
    for twin in cp.TWINS:
        assert len(run[twin]["margins"]) == s["eval_facts"]
        assert len(run[twin]["lm_margins"]) == s["eval_facts"]
        assert (tmp_path / "runs" / "smoke" / "seed0" / twin / "lm" / "config.json").exists()
    assert run["planted"]["margins"] != run["twin"]["margins"]
    again = cp.main(args)
    assert json.dumps(again["seeds"], sort_keys=True) == json.dumps(record["seeds"], sort_keys=True)


def test_pilot_writes_each_step_counts_figures(tmp_path: Path) -> None:
    args = ["--smoke", "--pilot", "1", "2", "--root", str(tmp_path / "runs"),
            "--out", str(tmp_path / "p.json")]  # fmt: skip
    record = cp.main(args)
    saved = json.loads((tmp_path / "p_pilot.json").read_text())
    assert saved["steps"] == record["steps"] and set(saved["steps"]) == {"1", "2"}
    for figures in saved["steps"].values():
        assert {"memory_gain", "val_ae_loss", "no_memory_loss", "margin_mean"} <= set(figures)


def test_fewer_seeds_than_registered_give_no_verdict(tmp_path: Path) -> None:
    args = ["--smoke", "--seeds", "1", "--root", str(tmp_path / "runs"),
            "--out", str(tmp_path / "p.json")]  # fmt: skip
    record = cp.main(args)
    assert set(record["seeds"]) == {"1"}
    assert record["primary"]["verdict"] == "none yet: seeds [0] of [0] not run"
