"""The CLI's links: ``data.tokenizer`` reaches modules that take a ``tokenizer`` and skips those
that do not (jsonargparse ignores an instantiation link whose target is not among the chosen
class's init args)."""

from __future__ import annotations

import json
from pathlib import Path

from lit_rlhf.cli import cli_main
from lit_rlhf.data import PromptDataModule
from lit_rlhf.modules import PPOModule
from tests.cli_fixtures import NoTokenizerModule
from tests.distributed.launch import run_python

TRAIN = {"class_path": "lit_rlhf.data.CountdownPrompts", "init_args": {"num_examples": 8}}
DATA = [
    "--data=lit_rlhf.data.PromptDataModule",
    "--data.tokenizer=builtin:tiny-llama",
    "--data.batch_size=2",
    f"--data.train={json.dumps(TRAIN)}",
]


def test_module_without_a_tokenizer_parameter_trains(tmp_path: Path) -> None:
    cli = cli_main(
        [
            "fit",
            "--model=tests.cli_fixtures.NoTokenizerModule",
            "--model.lr=0.2",
            *DATA,
            "--trainer.fast_dev_run=true",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    assert isinstance(cli.model, NoTokenizerModule) and cli.model.lr == 0.2
    assert isinstance(cli.datamodule, PromptDataModule)
    assert cli.trainer.state.finished and cli.model.batches_seen == 1


def test_ppo_module_gets_the_datamodules_tokenizer_object(tmp_path: Path) -> None:
    cli = cli_main(
        [
            "--model=lit_rlhf.modules.PPOModule",
            "--model.reward=lit_rlhf.rewards.CountdownReward",
            *DATA,
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    assert isinstance(cli.model, PPOModule)
    assert cli.model.tokenizer is cli.datamodule.tokenizer


def test_lit_rlhf_test_prints_test_metrics(tmp_path: Path) -> None:
    # the tiny config has no test source: the test loop runs on its validation prompts
    output = run_python(
        "-m",
        "lit_rlhf.cli",
        "test",
        "--config",
        "configs/ppo/countdown_tiny.yaml",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    )
    assert "Test metric" in output
    for key in ("test/pass@1", "test/reward"):
        assert key in output, output[-2000:]


def test_evaluating_a_checkpoint_keeps_the_configs_settings_and_resuming_warns(
    tmp_path: Path,
) -> None:
    """LightningCLI would evaluate a trained judge with the settings it was trained with (its
    saved hyperparameters replace the config's); lit-rlhf evaluates with the config's and names
    what differs, and a resume says which of the config's settings the checkpoint replaces."""
    import pytest

    config = str(Path(__file__).parents[1] / "configs" / "grm" / "rft_tiny.yaml")
    root = [f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    cli_main(["fit", "--config", config, *root, "--trainer.max_steps=1",
              "--trainer.limit_val_batches=0"])  # fmt: skip
    ckpt = tmp_path / "checkpoints" / "last.ckpt"  # the config's PeriodicCheckpoint
    with pytest.warns(UserWarning, match=r"judge\.eval_samples: config 2, checkpoint 1"):
        cli = cli_main(["validate", "--config", config, *root, f"--ckpt_path={ckpt}",
                        "--model.init_args.judge.eval_samples=2",
                        "--model.init_args.judge.inference=majority"])  # fmt: skip
    assert cli.model.judge_settings.eval_samples == 2 and cli.model.inference.mode == "majority"
    with pytest.warns(UserWarning, match=r"checkpoint's settings replace the config's \(optim\.lr"):
        cli = cli_main(["fit", "--config", config, *root, f"--ckpt_path={ckpt}",
                        "--model.init_args.optim.lr=0.5", "--trainer.max_steps=2",
                        "--trainer.limit_val_batches=0"])  # fmt: skip
    assert cli.model.optim.lr == 1.0e-3


def test_the_cli_does_not_offer_optimizer_or_scheduler_options(capsys) -> None:
    """The modules optimise manually with their own optimizer: LightningCLI's --optimizer would
    be ignored and --lr_scheduler never stepped, so they are refused."""
    import pytest

    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    assert "--optimizer" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        config = Path(__file__).parents[1] / "configs" / "ppo" / "countdown_tiny.yaml"
        cli_main(["fit", "--config", str(config), "--optimizer=Adam"])
    assert exit_info.value.code != 0


# ----------------------------------------------------------------- trainer.precision: auto
NO_BF16_CPU = frozenset(["fpu", "sse2", "avx", "avx2", "fma", "avx512f", "avx512bw"])
BF16_CPU = NO_BF16_CPU | {"avx512_bf16", "amx_bf16"}


def _trainer_precision(monkeypatch, flags: frozenset[str], *overrides: str) -> str:
    """``trainer.precision`` of a CLI-built trainer (tiny Countdown config, CPU with ``flags``)."""
    from lit_rlhf.training import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    config = Path(__file__).parents[1] / "configs" / "ppo" / "countdown_tiny.yaml"
    cli = cli_main(["--config", str(config), "--trainer.logger=false", *overrides], run=False)
    return str(cli.trainer.precision)


def test_precision_auto_fits_the_cpu(monkeypatch, caplog) -> None:
    import logging

    with caplog.at_level(logging.INFO):
        assert _trainer_precision(monkeypatch, NO_BF16_CPU, "--trainer.precision=auto") == "32-true"
        assert "precision: auto -> 32-true: the CPU has no native bf16" in caplog.text
        chosen = _trainer_precision(monkeypatch, BF16_CPU, "--trainer.precision=auto")
    assert chosen == "bf16-mixed"
    assert "precision: auto -> bf16-mixed: the CPU multiplies bf16 natively" in caplog.text


def test_an_explicit_precision_is_kept(monkeypatch) -> None:
    assert _trainer_precision(monkeypatch, NO_BF16_CPU, "--trainer.precision=bf16-mixed") == (
        "bf16-mixed"
    )
    assert _trainer_precision(monkeypatch, BF16_CPU, "--trainer.precision=32-true") == "32-true"
    assert _trainer_precision(monkeypatch, BF16_CPU) == "32-true"  # Lightning's default


def test_the_trainer_with_auto_precision_offers_every_lightning_option(capsys) -> None:
    import inspect

    import pytest
    from lightning import Trainer

    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    help_text = capsys.readouterr().out
    for name in inspect.signature(Trainer.__init__).parameters:
        if name != "self":
            assert f"--trainer.{name} " in help_text, name
    assert "Literal['auto']" in help_text


def test_cpu_configs_ship_precision_auto() -> None:
    """A CPU config that sets a precision sets ``auto``: a fixed bf16 is ~5x slower than float32
    on a CPU without native bf16."""
    import yaml

    configs = sorted((Path(__file__).parents[1] / "configs").rglob("*.yaml"))
    cpu_precisions = {}
    for path in configs:
        trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
        if trainer.get("accelerator") == "cpu" and "precision" in trainer:
            cpu_precisions[path.name] = trainer["precision"]
    assert cpu_precisions["countdown_smollm2.yaml"] == "auto"  # the demo
    assert set(cpu_precisions.values()) == {"auto"}, cpu_precisions
