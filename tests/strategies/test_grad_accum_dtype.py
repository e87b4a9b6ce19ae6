"""DeepSpeed sums the micro-batches' gradients in fp32 under the shipped fragments (issue 36, N14:
DeepSpeed's default is the model's dtype, bf16 under bf16-mixed; verl's FSDP accumulates in fp32).
Built as strategy configs only: the fragments run on 2 processes in tests/distributed, and one
process through the preset dry run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("deepspeed")

from deepspeed.runtime.config import DeepSpeedConfig

from lit_rlhf.strategies import CPUDeepSpeedStrategy, DeepSpeedStrategy

FRAGMENTS = sorted((Path(__file__).parents[2] / "configs" / "trainer").glob("*deepspeed*.yaml"))
CLASSES = {"DeepSpeedStrategy": DeepSpeedStrategy, "CPUDeepSpeedStrategy": CPUDeepSpeedStrategy}


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.stem)
def test_each_deepspeed_fragment_accumulates_in_fp32(fragment):
    strategy = yaml.safe_load(fragment.read_text())["trainer"]["strategy"]
    cls = CLASSES[strategy["class_path"].rsplit(".", 1)[-1]]
    built = cls(**strategy["init_args"])
    assert built.config["data_types"] == {"grad_accum_dtype": "fp32"}
    assert built.config["zero_optimization"]["stage"] == strategy["init_args"]["stage"]
    # DeepSpeed itself reads it (the batch keys are what Lightning fills in at setup)
    config = {**built.config, "train_micro_batch_size_per_gpu": 1, "train_batch_size": 1}
    assert DeepSpeedConfig(config).grad_accum_dtype == "fp32"


def test_without_the_setting_deepspeeds_default_stays():
    assert "data_types" not in DeepSpeedStrategy(stage=2).config


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grad_accum_dtype": "float32"}, r"grad_accum_dtype='float32' is not known\. Fix: one"),
        (
            {"grad_accum_dtype": "fp32", "config": {"data_types": {"grad_accum_dtype": "bf16"}}},
            r"config sets data_types\.grad_accum_dtype='bf16' .* Fix: set one of them",
        ),
    ],
)
def test_a_bad_or_conflicting_value_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeepSpeedStrategy(**kwargs)
