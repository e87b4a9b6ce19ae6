"""scripts/repro/calculator_compare.py: the arms' run fragments (a warm-started arm trains its SFT
stage and starts PPO from its export; a cold arm starts from the config's model), the quarter
figures, and (slow) a whole two-stage run of one step per arm."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.helpers import load_script


def test_warm_arm_starts_ppo_from_its_own_sft_export(tmp_path: Path):
    compare = load_script("repro/calculator_compare")
    sft = compare.sft_fragment(tmp_path, "calculator", 3)
    ppo = compare.arm_fragment(tmp_path, "calculator", 3, steps=5)
    export = tmp_path / "calculator" / "seed3" / "sft" / "hf"
    assert sft["model"]["init_args"]["export_dir"] == str(export)
    assert ppo["model"]["init_args"]["model"] == str(export)
    assert sft["seed_everything"] == ppo["seed_everything"] == 3
    assert sft["data"]["init_args"]["seed"] == ppo["data"]["init_args"]["seed"] == 3
    assert ppo["trainer"]["limit_train_batches"] == 5
    assert compare.TASKS["arithmetic"]["calculator"][1].endswith(
        "arithmetic_calculator_smollm2.yaml"
    )
    assert compare.ARMS["no_tool"][:2] == ("no_tool", True)


def test_cold_arms_start_from_the_configs_model(tmp_path: Path):
    compare = load_script("repro/calculator_compare")
    for arm in ("calculator_cold", "no_tool_cold", "no_tool_masked_cold"):
        assert "model" not in compare.arm_fragment(tmp_path, arm, 0, steps=2)["model"]["init_args"]
    masked = compare.arm_fragment(tmp_path, "no_tool_masked_cold", 0, steps=2)
    assert masked["model"]["init_args"]["rollout"]["overlong_filter"] is True


def test_quarter_figures():
    compare = load_script("repro/calculator_compare")
    got = compare.quarter_figures([0.0, 0.0, 0.5, 0.5, 1.0, 1.0, 0.5, 1.0])
    assert got == {"start": 0.0, "first_q": 0.0, "last_q": 0.75, "rise": 0.75}
    assert compare.quarter_figures([0.5, 1.0, 1.0, 1.0])["start"] == 0.75
    assert all(math.isnan(v) for v in compare.quarter_figures([]).values())


@pytest.mark.slow
def test_one_step_per_arm_runs_both_stages(tmp_path: Path):
    """The whole pipeline on the embedded SmolLM2 (about 5 minutes on 2 cores)."""
    compare = load_script("repro/calculator_compare")
    summary = compare.main(["--seeds", "0", "--steps", "1", "--out", str(tmp_path)])
    export = tmp_path / "arithmetic_steps1" / "calculator" / "seed0" / "sft" / "hf"
    assert (export / "config.json").is_file()
    assert set(summary["arms"]) == {"calculator", "no_tool"}
    calculator = summary["arms"]["calculator"]
    assert 0.0 <= calculator["tool_calls_first_q"]["mean"] <= 1.0
    assert calculator["sft_val_loss"]["mean"] < 1.0  # the warm start learned its demonstrations
