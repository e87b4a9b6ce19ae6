"""A real DeepSpeed ZeRO-3 checkpoint folder of another model as ``--ckpt_path`` (issue [3/5]):
the CLI reads rank 0's model states (``weights_only``) and refuses the folder with its path and
both models on the last line, before DeepSpeed would fail on the weights' shapes. The folder is
written by one CPU DeepSpeed process (tests/distributed/run_ppo.py, about 40 s)."""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest

from lit_rlhf.cli import cli_main
from lit_rlhf.cli.checkpoints import CheckpointError
from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "ppo" / "countdown_tiny.yaml")


def test_another_models_zero3_folder_names_the_path_and_both_models(tmp_path: Path) -> None:
    folder = tmp_path / "zero3-qwen"
    run_python(
        "-m", "tests.distributed.run_ppo", "zero3", "1", "1", str(tmp_path / "weights.pt"),
        "--save-checkpoint", str(folder), "--model", "builtin:tiny-qwen2",
    )  # fmt: skip
    assert (folder / "latest").is_file()  # DeepSpeed's layout, not a file
    cases = {
        # evaluation: the config's settings win, so the networks must be the config's
        "validate": r"a checkpoint of other networks than the config's \(model: checkpoint "
        r"'.*tiny-qwen2.*', config 'builtin:tiny-llama'\)",
        # resume: the checkpoint's model, but the config's tokenizer
        "fit": r"a run of model '.*tiny-qwen2.*', and the config trains 'builtin:tiny-llama' "
        r"with its tokenizer",
    }
    for subcommand, cause in cases.items():
        with pytest.raises(CheckpointError) as info:
            cli_main(
                [subcommand, "--config", TINY, f"--ckpt_path={folder}", "--trainer.logger=false"]
            )
        last = "".join(traceback.format_exception(info.value)).strip().splitlines()[-1]
        assert re.search(rf"--ckpt_path {re.escape(str(folder))}: {cause}", last), last
