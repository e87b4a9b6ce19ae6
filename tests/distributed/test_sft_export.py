"""SFTModule's export_dir under DeepSpeed on 2 CPU processes: ZeRO-3 gathers the partitioned
weights through the shared ``export_pretrained``, and the causal LM folder equals the ZeRO-2 run's
(where no parameter is partitioned), both different from the starting weights
(``pytest -m distributed``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed


def _export(tmp: Path, stage: int) -> dict[str, torch.Tensor]:
    folder = tmp / f"zero{stage}"
    run_python(
        "-m", "lit_rlhf.cli", "fit", "--config", "configs/sft/tiny.yaml",
        "--config", f"configs/trainer/cpu_deepspeed_zero{stage}.yaml",
        "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={tmp}",
        f"--model.init_args.export_dir={folder}",
    )  # fmt: skip
    from lit_rlhf.models import load_causal_lm

    model = load_causal_lm(str(folder))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow  # 22 s; the reward model's export (test_rm_export.py) runs the same path in CI
def test_zero3_export_gathers_the_same_weights_as_zero2(tmp_path: Path) -> None:
    zero3, zero2 = _export(tmp_path, 3), _export(tmp_path, 2)
    assert zero3.keys() == zero2.keys()
    for key in zero2:
        assert zero3[key].shape == zero2[key].shape and zero3[key].numel() > 0, key
        torch.testing.assert_close(zero3[key], zero2[key], atol=1e-5, rtol=0)
    from lit_rlhf.models import load_causal_lm

    start = load_causal_lm("builtin:tiny-llama").state_dict()  # the builtin's fixed weights
    moved = [k for k in start if not torch.equal(start[k], zero2[k])]
    assert len(moved) > len(start) // 2  # training changed the weights that were exported
