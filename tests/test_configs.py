"""Every YAML config runs: CPU configs with fast_dev_run, GPU-only configs with --print_config.

Trainer fragments (``configs/trainer/``) are not full configs: tests/strategies and
tests/distributed compose them with a full config and run or parse them there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_rlhf.cli import cli_main

CONFIG_DIR = Path(__file__).parents[1] / "configs"
CONFIGS = sorted(
    p for p in CONFIG_DIR.rglob("*.yaml") if not p.is_relative_to(CONFIG_DIR / "trainer")
)


def _is_gpu_only(path: Path) -> bool:
    trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
    return trainer.get("accelerator") == "gpu"


def _needs_smollm2(path: Path) -> bool:
    return "builtin:smollm2" in path.read_text()


def _needs_vllm(path: Path) -> bool:
    return "VLLMGenerationEngine" in path.read_text()


def _needs_server(path: Path) -> bool:
    return "VLLMServerEngine" in path.read_text()


def _needs_ifeval(path: Path) -> bool:
    return "InstructionReward" in path.read_text()


def _needs_lora(path: Path) -> bool:
    model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
    lora = (model.get("init_args") or {}).get("lora") or {}
    return lora.get("rank", 0) > 0


def test_configs_found():
    assert len(CONFIGS) >= 4


# the SmolLM2 configs `make test` runs: the README's main job and one SFT run; the other
# SmolLM2 configs (5-21 s each on 2 cores) have tiny-model twins here and run with -m slow
_SMOLLM2_IN_MAKE_TEST = {"ppo/countdown_smollm2.yaml", "sft/smollm2.yaml"}


def _cpu_config(path: Path) -> object:
    """A multi-turn episode on the embedded SmolLM2 takes minutes even for one batch on 2 cores
    (its turns are several generations): those configs, and the SmolLM2 configs outside
    :data:`_SMOLLM2_IN_MAKE_TEST`, run in the slow group."""
    name = f"{path.parent.name}/{path.name}"
    slow = _needs_smollm2(path) and (
        "environment:" in path.read_text() or name not in _SMOLLM2_IN_MAKE_TEST
    )
    return pytest.param(path, id=str(path), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("path", [_cpu_config(p) for p in CONFIGS if not _is_gpu_only(p)])
def test_cpu_config_fast_dev_run(path, tmp_path):
    if _needs_server(path):
        pytest.skip(
            "samples from a running vllm serve: tests/rollout/test_vllm_server.py and "
            "test_vllm_server_resume.py run this config through the CLI against a real one"
        )
    if _needs_smollm2(path):
        pytest.importorskip("gguf", reason="the SmolLM2 demo config needs the [demo] extra")
    if _needs_vllm(path):
        pytest.importorskip("vllm", reason="runs in the vLLM venv (make test-vllm)")
    if _needs_ifeval(path):
        pytest.importorskip("if_verifiable", reason="needs the [ifeval] extra")
    if _needs_lora(path):
        pytest.importorskip("peft", reason="lora_rank > 0 needs the [lora] extra")
    cli = cli_main(
        [
            "fit",
            "--config",
            str(path),
            "--trainer.fast_dev_run=true",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    assert cli.trainer.state.finished
    # one training batch: one rollout for the RL modules, one optimizer step for the reward model
    assert getattr(cli.model, "rollout_step", cli.trainer.global_step) == 1


@pytest.mark.parametrize("path", [p for p in CONFIGS if _is_gpu_only(p)], ids=str)
def test_gpu_config_parses(path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] in (
        "lit_rlhf.modules.PPOModule",
        "lit_rlhf.modules.GenerativeRewardModule",
        "lit_rlhf.modules.RewardModelModule",
        "lit_rlhf.modules.CompressorDecoderModule",
    )
