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
    (ckpt,) = tmp_path.glob("checkpoints/*.ckpt")
    with pytest.warns(UserWarning, match="eval_samples: config 2, checkpoint 1"):
        cli = cli_main(["validate", "--config", config, *root, f"--ckpt_path={ckpt}",
                        "--model.init_args.eval_samples=2",
                        "--model.init_args.inference=majority"])  # fmt: skip
    assert cli.model.hparams.eval_samples == 2 and cli.model.inference.mode == "majority"
    with pytest.warns(UserWarning, match=r"checkpoint's settings replace the config's \(lr"):
        cli = cli_main(["fit", "--config", config, *root, f"--ckpt_path={ckpt}",
                        "--model.init_args.lr=0.5", "--trainer.max_steps=2",
                        "--trainer.limit_val_batches=0"])  # fmt: skip
    assert cli.model.hparams.lr == 1.0e-3


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
