"""scripts/reproduce.py tre: the smoke preset end to end (tiny random model: every arm and seed,
the mechanism figures, the outputs, the cache on a second call) and the TRE module's pieces
(difficulty choice, fragments, figures from a hand-made metrics.csv)."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import reproduce  # noqa: E402
from repro import tre, tre_runs  # noqa: E402

MECHANISM = ("tail_mass_topk", "tail_mass_topp", "entropy_topk", "entropy_topp")


def test_smoke_runs_every_arm_and_seed_then_reuses_the_cache(tmp_path: Path, monkeypatch) -> None:
    reproduce.main(["tre", "--smoke", "--out", str(tmp_path)])
    out = tmp_path / "tre" / "smoke"
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == set(tre.PAPER.arms) == {"vanilla", "entropy", "tre-k"}
    for arm, by_seed in results["runs"].items():
        assert set(by_seed) == {"0", "1"}, arm
        for figures in by_seed.values():
            for key in (*MECHANISM, "pass@1", "pass@k", "sampled_pass@1"):
                assert math.isfinite(figures[key]), (arm, key)
            assert 0 <= figures["tail_mass_topk"] <= 1
            # one point per rollout step of the preset (2 steps)
            assert [s for s, _ in figures["curves"]["tail_mass_topk"]] == [1, 2]
    precheck = results["precheck"]
    assert precheck["go"] is True and isinstance(precheck["reason"], str)
    assert precheck["chosen"] == tre.CPU_DIFFICULTIES[-1]["name"]
    assert 0 <= precheck["tried"][0]["pass@1"] <= 1
    assert results["summary"]["primary"]["metric"] == "tail_mass_topk"
    assert "entropy - tre-k" in (out / "results.md").read_text()
    assert (out / "tre.png").read_bytes()[:4] == b"\x89PNG"

    def fail(*args: object) -> None:
        raise AssertionError("a cached run was run again")

    monkeypatch.setattr(tre.PAPER, "run_arm", fail)
    monkeypatch.setattr(tre.PAPER, "precheck", fail)
    again = reproduce.main(["tre", "--smoke", "--out", str(tmp_path)])
    assert again is not None and again["precheck"] == precheck


def test_first_difficulty_in_range_or_the_nearest() -> None:
    tried = [
        {"name": "a", "pass@1": 0.9},
        {"name": "b", "pass@1": 0.3},
        {"name": "c", "pass@1": 0.1},
    ]
    assert tre_runs.pick_difficulty(tried, 0.05, 0.5)["name"] == "b"
    assert tre_runs.pick_difficulty(tried[:1], 0.05, 0.5) is None
    # distances to [0.05, 0.5]: 0.9 -> 0.4, 0.0 -> 0.05
    far = [{"name": "a", "pass@1": 0.9}, {"name": "z", "pass@1": 0.0}]
    assert tre_runs.nearest_difficulty(far, 0.05, 0.5)["name"] == "z"


def test_every_arm_logs_the_diagnostics_and_adds_only_its_own_term(tmp_path: Path) -> None:
    settings = tre.PRESETS["cpu"].settings
    difficulty = tre.CPU_DIFFICULTIES[0]
    for arm, callback in tre.arm_callbacks(0.001).items():
        fragment = tre_runs.arm_fragment(settings, difficulty, tmp_path, 7, callback)
        callbacks = fragment["trainer"]["callbacks"]
        assert callbacks[0] == {
            "class_path": "lit_rlhf.callbacks.TrustRegionDiagnostics",
            "init_args": {"k": 2, "p": 0.99},
        }
        assert callbacks[1:] == ([] if arm == "vanilla" else [callback])
        model = fragment["model"]["init_args"]
        assert fragment["seed_everything"] == 7 and model["update"]["seed"] == 7
        assert model["eval"]["samples"] == settings["k"] == 4
        assert model["update"]["mini_batch_size"] == 8  # the preset's, beside the run's seed
        data = fragment["data"]["init_args"]
        # training tasks: seed 0, steps x batch of them; held-out: seed 1, never trained on
        train, val = data["train"]["init_args"], data["val"]["init_args"]
        assert (train["seed"], train["num_examples"]) == (0, settings["steps"] * 4)
        assert (val["seed"], val["num_examples"]) == (1, settings["eval_prompts"])
        assert train["num_numbers"] == val["num_numbers"] == 3 and "name" not in train
    assert settings["model"] == {"update": {"mini_batch_size": 8}}  # no run's seed in the preset
    assert tre.arm_callbacks(0.001)["tre-k"]["init_args"] == {
        "alpha": 0.001,
        "mode": "topk",
        "k": 2,
    }
    assert tre.arm_callbacks(0.001)["entropy"]["init_args"] == {"alpha": 0.001}


def test_curve_figures_from_a_hand_made_metrics_csv(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    key = "TrustRegionDiagnostics/tail_mass_topk"
    rows = [{"rollout/step": s, key: v} for s, v in [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.7)]]
    rows.append({"val/pass@1": 0.5})  # the validation row has no rollout step
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["rollout/step", key, "val/pass@1"])
        writer.writeheader()
        writer.writerows(rows)
    figures = tre_runs.curve_figures(path)
    # end = mean of the last 3 steps (0.2 + 0.3 + 0.7) / 3 = 0.4; change = 0.4 - 0.1 = 0.3
    assert figures["tail_mass_topk"] == pytest.approx(0.4)
    assert figures["tail_mass_topk_change"] == pytest.approx(0.3)
    assert figures["curves"]["tail_mass_topk"] == [[1, 0.1], [2, 0.2], [3, 0.3], [4, 0.7]]
    assert math.isnan(figures["entropy_topp"]) and figures["curves"]["entropy_topp"] == []
    assert tre_runs.eval_figures({"val/pass@1": 0.5, "val/pass@4": 0.75}, 4)["pass@k"] == 0.75
