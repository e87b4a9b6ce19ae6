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
        "cpu_fsdp2",
        "ddp",
        "deepspeed_zero2",
        "deepspeed_zero3",
        "fsdp2",
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
    # the GPU fragments set no process count: the config's own stays (N5)
    base_devices = yaml.safe_load(base.read_text())["trainer"]["devices"]
    assert trainer["devices"] == expected.get("devices", base_devices)
    strategy = expected["strategy"]
    if isinstance(strategy, str):
        assert trainer["strategy"] == strategy
    else:
        assert trainer["strategy"]["class_path"] == strategy["class_path"]
        for name, value in strategy.get("init_args", {}).items():  # ZeRO stage, ...
            assert trainer["strategy"]["init_args"][name] == value


def _composed_trainer(capsys, *configs: Path) -> dict:
    args = [x for c in configs for x in ("--config", str(c))]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *args, "--print_config"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    return yaml.safe_load("\n".join(x for x in lines if not x.startswith("[")))["trainer"]


@pytest.mark.parametrize(
    ("preset", "fragment"),
    [("grm/consistrm_qwen3-8b", "deepspeed_zero3"), ("ppo/multidomain_mgs_qwen2.5-7b",
      "deepspeed_zero2"), ("ppo/countdown_tre", "deepspeed_zero2")],
)  # fmt: skip
def test_a_gpu_fragment_keeps_the_presets_world_size(preset, fragment, capsys):
    """An 8-GPU preset stays on 8 processes, a one-GPU preset on one, whatever node it lands
    on: the DeepSpeed fragments do not set ``devices`` (``auto`` would take every GPU and, with
    per-process batch sizes, change the global batch silently)."""
    config = CONFIGS / f"{preset}.yaml"
    own = yaml.safe_load(config.read_text())["trainer"]["devices"]
    trainer = _composed_trainer(capsys, config, CONFIGS / "trainer" / f"{fragment}.yaml")
    assert trainer["devices"] == own and own in (1, 8)


def test_the_ddp_fragment_says_it_starts_two_processes(capsys):
    """``ddp.yaml`` replaces the process count with 2 (its header says so and how to ask for
    more); a preset's global batch keeps its size across that change."""
    fragment = CONFIGS / "trainer" / "ddp.yaml"
    assert "It starts 2 processes" in fragment.read_text()
    trainer = _composed_trainer(capsys, CONFIGS / "ppo" / "countdown_tre.yaml", fragment)
    assert trainer["devices"] == 2 and trainer["strategy"] == "ddp"
