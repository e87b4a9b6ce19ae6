"""``lit-rlhf plan`` as a user runs it (a subprocess from another folder; its options in
process), and the plan at a module's setup, before any weights load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lit_rlhf.plan.check as check
from lit_rlhf.cli import cli_main
from lit_rlhf.cli.dispatch import main
from lit_rlhf.cli.plan import composed_config
from lit_rlhf.plan.report import plan_from_config

REPO = Path(__file__).resolve().parents[2]
LIT_RLHF = Path(sys.executable).parent / "lit-rlhf"
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def test_plan_of_a_preset_from_another_folder(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    preset = REPO / "configs/ppo/countdown_tre.yaml"
    done = subprocess.run([str(LIT_RLHF), "plan", "--config", str(preset)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "PPOModule on 1 GPU(s) (trainer.devices=1) of 80.0 GiB" in out
    for row in ("policy: weights (float32)", "critic: Adam moments (float32)",
                "vLLM: weights + KV cache", "weight-sync snapshot", "global batch: 512 prompts",
                "sequences per rollout: 4,096", "optimizer steps per rollout: 8",
                "total optimizer steps: 3,248", "update step FLOPs", "verdict: "):  # fmt: skip
        assert row in out, row
    assert not list(tmp_path.iterdir()), "plan wrote files"


def test_options_json_gpus_memory_and_arch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # the HH preset outside the repository's configs/: its reward model folder is unknown
    hh = tmp_path / "hh.yaml"
    shutil.copy(REPO / "configs/ppo/hh_tre_ultrafeedback.yaml", hh)
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--config", str(hh)])
    assert exit_info.value.code == 1
    assert "--arch runs/rm_ultrafeedback/hf=HUB_ID" in capsys.readouterr().err
    main(["plan", "--config", str(hh), "--arch", "runs/rm_ultrafeedback/hf=Qwen/Qwen2.5-1.5B",
          "--gpus", "2", "--gpu-memory", "141GB", "--json",
          "--model.init_args.engine.init_args.snapshot_device", "cpu"])  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert plan["world"] == 2 and plan["gpu_memory"] == 141 * 10**9
    names = [item["name"] for item in plan["items"]]
    assert "reward model: runs/rm_ultrafeedback/hf (bfloat16)" in names
    batch = plan["batch"]  # the preset's 512 prompts per rollout, across the 2 processes
    assert batch["global_batch"] == 512 and plan["global_sequences"] == 4096
    assert batch["per_rank"] == 512 // 2 and batch["mini_batch_per_rank"] == 512 // 2
    snapshot = next(i for i in plan["items"] if i["kind"] == "snapshot")
    assert snapshot["bytes"] == 0  # the --model.* override reached the plan
    # inside the repository the preset that writes the folder names its model
    main(["plan", "--config", str(REPO / "configs/ppo/hh_tre_ultrafeedback.yaml"), "--json"])
    assert "reward model: runs/rm_ultrafeedback/hf" in capsys.readouterr().out


def test_help_lists_the_plan_options(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--gpus", "--gpu-memory", "--arch", "--json", "--config"):
        assert option in out


@pytest.mark.parametrize(
    "config",
    ["ppo/countdown_tiny", "grm/rft_tiny", "sft/tiny", "rm/bt_tiny", "dpo/tiny",
     "compressor/tiny"],
)  # fmt: skip
def test_the_setup_check_refuses_before_any_weights_load(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU each module runs the plan in setup (here the GPU's memory is injected: 1 MiB,
    less than the tiny networks' lower bound)."""
    monkeypatch.setattr(check, "device_memory", lambda module: 2**20)
    cli = cli_main(["--config", str(REPO / f"configs/{config}.yaml"), "--trainer.logger=false",
                    "--trainer.enable_checkpointing=false"], run=False)  # fmt: skip
    module = cli.model
    with pytest.raises(ValueError, match=rf"memory plan \({type(module).__name__}, 1 GPU.*Fix:"):
        cli.trainer.fit(module, datamodule=cli.datamodule)
    built = [n for n in ("policy", "model", "compressor") if getattr(module, n, None) is not None]
    assert not built, f"{built} loaded before the refusal"


def test_memory_check_warn_and_off_let_the_run_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "device_memory", lambda module: 2**20)
    for mode, warns in (("warn", True), ("off", False)):
        cli = cli_main(["--config", str(REPO / "configs/sft/tiny.yaml"),
                        f"--model.init_args.precision.memory_check={mode}",
                        "--trainer.logger=false"], run=False)  # fmt: skip
        cli.trainer.strategy.connect(cli.model)
        cli.model.trainer = cli.trainer
        if warns:
            with pytest.warns(UserWarning, match="lower bound does not fit .memory_check: warn"):
                assert check.check_memory(cli.model) is not None
        else:
            assert check.check_memory(cli.model) is None


def test_the_setup_plan_reads_the_live_run_as_the_config_does() -> None:
    """Multi-domain PPO with gradient surgery and a scalar reward model by task: the plan built
    from the live module, trainer and data equals the one built from the config."""
    preset = REPO / "configs/ppo/multidomain_tiny.yaml"
    cli = cli_main(["--config", str(preset), "--trainer.logger=false"], run=False)
    module, trainer, data = cli.model, cli.trainer, cli.datamodule
    trainer.strategy.connect(module)
    module.trainer, trainer.datamodule, data.trainer = trainer, data, trainer  # as fit does
    data.setup("fit")
    plan = check.check_memory(module, device_bytes=80 * 2**30)
    assert plan is not None and plan.fits and plan.world == 1
    tasks = len(set(data.train_data["task"]))
    surgery = next(i for i in plan.items if i.kind == "buffer")
    trainable = sum(p.numel() for p in module.policy.parameters()) if module.policy else None
    assert surgery.name.startswith(f"gradient surgery: {tasks} domain")
    from_config = plan_from_config(
        composed_config(["--config", str(preset)]), gpu_memory=80 * 2**30
    )
    assert [i.name for i in plan.items] == [i.name for i in from_config.items]
    assert [i.bytes for i in plan.items if i.kind != "activations"] == [
        i.bytes for i in from_config.items if i.kind != "activations"
    ]
    assert plan.batch.per_rank == data.batch_size == from_config.batch.per_rank
    assert plan.seq_len <= from_config.seq_len  # the live plan reads the longest prompt kept
    assert plan.seq_len - data.longest_prompt == module.engine.max_new_tokens
    assert trainable is None  # nothing was loaded: the plan reads no weights
