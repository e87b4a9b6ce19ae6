"""scripts/reproduce.py mgs: the smoke preset end to end (tiny random models: every arm and seed,
the conflict figures, the outputs, the cache on a second call) and the module's pieces (the
variance filter, the arms' configs, the figures from a hand-made metrics.csv)."""

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
from repro import mgs, mgs_runs  # noqa: E402

MECHANISM = ("conflict_gap", "module_conflict", "global_conflict", "module_cosine",
             "global_cosine", "module_removed", "global_removed", "removed_share")  # fmt: skip


def test_smoke_runs_every_arm_and_seed_then_reuses_the_cache(tmp_path: Path, monkeypatch) -> None:
    reproduce.main(["mgs", "--smoke", "--out", str(tmp_path)])
    out = tmp_path / "mgs" / "smoke"
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == set(mgs.PAPER.arms) == {"mixed", "null", "pcgrad", "mgs"}
    for arm, by_seed in results["runs"].items():
        assert set(by_seed) == {"0", "1"}, arm
        for figures in by_seed.values():
            # a step where a domain's rewards all tied has a zero domain gradient: its pairs have
            # no cosine (counted in undefined_pairs), and a step with none left logs no conflict
            assert [s for s, _ in figures["curves"]["undefined_pairs"]] == [1, 2]
            for key in (*MECHANISM, "reward_chat", "reward_countdown", "reward_ifeval"):
                assert math.isfinite(figures[key]) or figures["undefined_pairs"] > 0, (arm, key)
            assert {s for s, _ in figures["curves"]["module_conflict"]} <= {1, 2}
    runs = results["runs"]
    for seed in ("0", "1"):
        # the null arm trains exactly as the mixed arm (only the measured labels differ) ...
        assert (
            runs["null"][seed]["curves"]["reward_chat"]
            == runs["mixed"][seed]["curves"]["reward_chat"]
        )
        # ... and a measure-only arm removes nothing
        assert runs["mixed"][seed]["removed_share"] == 0.0 == runs["null"][seed]["removed_share"]
    precheck = results["precheck"]
    assert precheck["go"] is True and isinstance(precheck["reason"], str)
    assert set(precheck["domains"]) == {"chat", "countdown", "ifeval"}
    for task, path in precheck["pools"].items():
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        assert len(rows) == precheck["domains"][task]["kept"] == 3
        assert {r["task"] for r in rows} == {task}
    assert results["summary"]["primary"]["metric"] == "conflict_gap"
    assert "mixed - null" in (out / "results.md").read_text()
    assert (out / "mgs.png").read_bytes()[:4] == b"\x89PNG"

    def fail(*args: object) -> None:
        raise AssertionError("a cached run was run again")

    monkeypatch.setattr(mgs.PAPER, "run_arm", fail)
    monkeypatch.setattr(mgs.PAPER, "precheck", fail)
    again = reproduce.main(["mgs", "--smoke", "--out", str(tmp_path)])
    assert again is not None and again["precheck"] == precheck


def test_the_filter_keeps_prompts_whose_group_rewards_differ() -> None:
    scores = {
        "countdown": [[0, 0, 0, 0], [0, 1, 0, 0], [0.1, 0.1, 0.1, 0.1]],
        "chat": [[0.2, 0.3, 0.25, 0.2], [0.5, 0.5, 0.5, 0.5]],
    }
    figures = mgs_runs.filter_figures(scores, min_pool=1, floor=1e-6)
    assert figures["go"] is True
    countdown = figures["domains"]["countdown"]
    assert (countdown["candidates"], countdown["kept"]) == (3, 1)
    assert countdown["kept_share"] == pytest.approx(1 / 3)
    # group stds 0, sqrt(3)/4 (one 1 among four), 0
    assert countdown["mean_group_std"] == pytest.approx(math.sqrt(3) / 4 / 3)
    assert figures["domains"]["chat"]["kept"] == 1
    refused = mgs_runs.filter_figures(scores, min_pool=2, floor=1e-6)
    assert refused["go"] is False and "countdown" in refused["reason"]
    assert mgs_runs.group_std([1, 3, 0, 0], 2) == [1.0, 0.0]
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        mgs_runs.group_std([1, 2], 3)


def test_arm_configs_differ_only_in_the_surgery_callback(tmp_path: Path) -> None:
    settings = mgs.PRESETS["cpu"].settings
    pools = {"countdown": "c.jsonl", "chat": "h.jsonl", "ifeval": "i.jsonl"}
    configs = {arm: mgs_runs.arm_fragment(settings, arm, 3, tmp_path, pools)
               for arm in mgs.PAPER.arms}  # fmt: skip
    surgery = {arm: c["trainer"]["callbacks"][-1]["init_args"] for arm, c in configs.items()}
    assert surgery["mixed"] == {"granularity": "module", "apply": False, "seed": 3,
                                "diagnostics": ["module", "global"]}  # fmt: skip
    assert surgery["null"] == {**surgery["mixed"], "shuffle_tasks": True}
    assert surgery["pcgrad"]["granularity"] == "global" and surgery["pcgrad"]["apply"] is True
    assert surgery["mgs"]["granularity"] == "module" and surgery["mgs"]["apply"] is True
    data = configs["mgs"]["data"]["init_args"]
    assert data["seed"] == 3 and data["batch_size"] == settings["batch_size"]
    mixture = data["train"]["init_args"]
    assert mixture["num_examples"] == settings["steps"] * settings["batch_size"]
    assert [s["init_args"]["path"] for s in mixture["sources"]] == ["h.jsonl", "c.jsonl",
                                                                   "i.jsonl"]  # fmt: skip
    assert configs["mgs"]["model"]["init_args"]["model"] == "builtin:smollm2-135m-instruct"
    assert configs["mgs"]["model"]["init_args"]["update"]["seed"] == 3  # merged into the group
    assert configs["mgs"]["trainer"]["limit_train_batches"] == settings["steps"]
    gpu = mgs.PRESETS["gpu"].settings
    authors = mgs_runs.arm_fragment(gpu, "mgs", 0, tmp_path, pools)
    assert authors["trainer"]["callbacks"][-1]["init_args"]["granularity"] == "tensor"
    assert authors["trainer"]["strategy"]["init_args"] == {"stage": 2, "grad_accum_dtype": "fp32"}
    assert authors["model"]["init_args"]["model"] == "Qwen/Qwen2.5-7B"
    assert [c["class_path"] for c in authors["trainer"]["callbacks"]] == [
        "lit_rlhf.callbacks.EntropyBonus",
        mgs_runs.SURGERY,
    ]


def test_figures_from_a_metrics_csv(tmp_path: Path) -> None:
    key = "ModularGradientSurgery/"
    rows = [
        {"rollout/step": 1, key + "module/conflict_fraction": 0.3,
         key + "global/conflict_fraction": 0.0, "reward/chat/score": 0.1},
        {"rollout/step": 2, key + "module/conflict_fraction": 0.5,
         key + "global/conflict_fraction": 0.2, "reward/chat/score": 0.3},
        {"rollout/step": 3, key + "module/conflict_fraction": 0.4,
         key + "global/conflict_fraction": 0.1, "reward/chat/score": 0.5},
    ]  # fmt: skip
    path = tmp_path / "metrics.csv"
    columns = sorted({k for r in rows for k in r} | set(mgs_runs.CURVES.values()))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    figures = mgs_runs.run_figures(path, ["chat"])
    assert figures["conflict_gap"] == pytest.approx((0.3 + 0.3 + 0.3) / 3)
    assert figures["module_conflict"] == pytest.approx(0.4)
    assert figures["reward_chat"] == pytest.approx(0.4)  # steps 2-3: the second half
    assert figures["curves"]["conflict_gap"] == [[1, pytest.approx(0.3)], [2, pytest.approx(0.3)],
                                                 [3, pytest.approx(0.3)]]  # fmt: skip
    assert math.isnan(figures["module_cosine"])  # never logged
