"""Every trainer fragment in configs/trainer composes with a full config (parsed only; the CPU
strategy fragments also run on 2 processes in tests/distributed, the logger fragments in
tests/training/test_loggers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_rlhf.cli import cli_main

CONFIGS = Path(__file__).parents[2] / "configs"
FRAGMENTS = sorted((CONFIGS / "trainer").glob("*.yaml"))


def test_fragments_found():
    assert {p.stem for p in FRAGMENTS} >= {
        "cpu_deepspeed_zero2",
        "cpu_deepspeed_zero3",
        "ddp",
        "deepspeed_zero2",
        "deepspeed_zero3",
        "mlflow",
        "wandb",
    }


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.stem)
def test_fragment_composes_and_opens_with_its_command(fragment, capsys):
    text = fragment.read_text()
    assert text.startswith("# ") and "Hardware:" in text and "Command: lit-rlhf fit" in text
    gpu = yaml.safe_load(text)["trainer"].get("accelerator") == "gpu"
    base = CONFIGS / "ppo" / ("countdown_qwen2.5-1.5b.yaml" if gpu else "countdown_tiny.yaml")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(base), "--config", str(fragment), "--print_config"])
    assert exit_info.value.code == 0
    # importing deepspeed may print its accelerator notice ("[<time>] [WARNING] ...") first
    lines = capsys.readouterr().out.splitlines()
    trainer = yaml.safe_load("\n".join(x for x in lines if not x.startswith("[")))["trainer"]
    expected = yaml.safe_load(text)["trainer"]
    if "logger" in expected:  # a logger fragment replaces the base config's loggers
        classes = [logger["class_path"] for logger in trainer["logger"]]
        assert classes == [logger["class_path"] for logger in expected["logger"]]
        return
    assert trainer["devices"] == expected["devices"]
    strategy = expected["strategy"]
    if isinstance(strategy, str):
        assert trainer["strategy"] == strategy
    else:
        assert trainer["strategy"]["class_path"] == strategy["class_path"]
        assert trainer["strategy"]["init_args"]["stage"] == strategy["init_args"]["stage"]
