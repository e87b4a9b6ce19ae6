"""The plan counts on-policy distillation's teacher: a local one's weights, in the reference's
dtype, as many bytes as the network the run loads; a served one (``distill.teacher_urls``)
nothing on the training GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rlhf.cli.dispatch import main
from lit_rlhf.models.loading import load_causal_lm

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs/ppo/countdown_distill_tiny.yaml")
TEACHER = "builtin:tiny-llama-agent"
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def plan_items(capsys: pytest.CaptureFixture, *overrides: str) -> dict[str, dict]:
    capsys.readouterr()  # what loading a model printed before
    main(["plan", "--config", CONFIG, "--json", *overrides])
    plan = json.loads(capsys.readouterr().out)
    return {item["name"]: item for item in plan["items"] if "teacher" in item["name"]}


def test_a_local_teacher_is_counted_as_the_weights_the_run_loads(
    capsys: pytest.CaptureFixture,
) -> None:
    weights = sum(p.numel() for p in load_causal_lm(TEACHER).parameters())
    items = plan_items(capsys)
    assert list(items) == [f"distillation teacher: {TEACHER} (float32)"]
    item = items[f"distillation teacher: {TEACHER} (float32)"]
    assert item["bytes"] == 4 * weights and item["kind"] == "frozen"
    half = plan_items(capsys, "--model.init_args.precision.reference_dtype", "bfloat16")
    assert [i["bytes"] for i in half.values()] == [2 * weights]


def test_a_served_teacher_holds_nothing_on_the_training_gpu(
    capsys: pytest.CaptureFixture,
) -> None:
    items = plan_items(capsys, "--model.init_args.distill.teacher_urls", "[http://127.0.0.1:9]")
    assert [(name, i["bytes"]) for name, i in items.items()] == [
        (f"distillation teacher: {TEACHER}", 0)
    ]


def test_the_plan_command_from_another_folder_lists_the_teacher(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    config = tmp_path / "my_distill.yaml"
    shutil.copy(CONFIG, config)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lit-rlhf"), "plan", "--config", str(config)],
        cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"distillation teacher: {TEACHER} (float32)" in done.stdout
