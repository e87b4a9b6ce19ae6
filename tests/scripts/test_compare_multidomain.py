"""scripts/compare_multidomain.py: the gpu preset composes the authors' 7B recipe with its ZeRO-2
fragment and keeps its granularity; the cpu preset runs end to end and reports held-out rewards."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers import load_script


def test_the_gpu_preset_runs_the_7b_recipe_under_zero2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    script = load_script("compare_multidomain")
    script.main(["--preset", "gpu", "--dry-run", "--out", str(tmp_path), "--seeds", "1"])
    commands = [line for line in capsys.readouterr().out.splitlines() if "lit_rlhf.cli fit" in line]
    assert len(commands) == 4
    for command in commands:
        assert "--config configs/ppo/multidomain_mgs_qwen2.5-7b.yaml --config " \
               "configs/trainer/deepspeed_zero2.yaml --config" in command  # fmt: skip
    arms = {a: yaml.safe_load((tmp_path / f"{a}-seed1.yaml").read_text()) for a in script.ARMS}
    surgery = {
        a: [c["init_args"] for c in f["trainer"]["callbacks"] if "Surgery" in c["class_path"]]
        for a, f in arms.items()
    }
    assert surgery["mgs"] == [{"granularity": "tensor", "seed": 1}]  # the preset's (authors')
    assert surgery["pcgrad"] == [{"granularity": "global", "seed": 1}]
    assert surgery["mixed"] == [] == surgery["sequential"]
    kept = [c["class_path"] for c in arms["mixed"]["trainer"]["callbacks"]]
    assert kept == ["lit_rlhf.callbacks.EntropyBonus"]  # the preset's other callbacks stay
    assert "limit_train_batches" not in arms["mgs"]["trainer"]  # the full run


@pytest.mark.slow
def test_the_cpu_preset_runs_and_reports_held_out_rewards(tmp_path: Path) -> None:
    script = load_script("compare_multidomain")
    script.main(["--preset", "cpu", "--arms", "mixed", "mgs", "--seeds", "0", "--steps", "2",
                 "--last", "2", "--out", str(tmp_path)])  # fmt: skip
    results = (tmp_path / "results.md").read_text()
    training, rest = results.split("Held-out validation reward")
    held_out, surgery = rest.split("Gradient conflicts")
    for table in (training, held_out):  # one row per arm, every domain measured
        rows = [line for line in table.splitlines() if line.startswith(("| mixed", "| mgs"))]
        assert len(rows) == 2 and "n/a" not in table
    assert "| mgs |" in surgery and "| mixed |" not in surgery
    assert (tmp_path / "curves.png").stat().st_size > 0
