"""Global batch sizes: ``data.init_args.global_batch_size`` and
``model.init_args.update.global_mini_batch_size`` (prompts across all processes) are divided by
the world size at setup; a world size that does not divide them, or a per-process and a global
size of the same thing together, are refused with the fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_rlhf.data import CountdownPrompts, PromptDataModule, SFTDataModule
from lit_rlhf.settings import DataBatchSettings, MismatchSettings, UpdateSettings
from lit_rlhf.training import PPOSettings
from tests.distributed.launch import run_python


def test_a_global_batch_is_split_over_the_processes():
    batch = DataBatchSettings(global_batch_size=512)
    assert [batch.per_process(n) for n in (1, 2, 8)] == [512, 256, 64]
    assert DataBatchSettings(batch_size=64).per_process(8) == 64  # per process: as given
    assert DataBatchSettings().per_process(4) == 8  # neither: the default 8 per process


def test_the_global_mini_batch_counts_prompts_and_becomes_sequences_per_process():
    update = UpdateSettings(global_mini_batch_size=64)  # verl's ppo_mini_batch_size
    assert not update.whole_rollout
    assert update.per_process(8, samples_per_prompt=8).mini_batch_size == 64  # 8 prompts x 8
    assert update.per_process(1, samples_per_prompt=8).mini_batch_size == 512
    assert UpdateSettings(mini_batch_size=32).per_process(8, 8).mini_batch_size == 32


@pytest.mark.parametrize(
    ("build", "key"),
    [
        (lambda n: DataBatchSettings(global_batch_size=64).per_process(n),
         "data.init_args.global_batch_size=64"),
        (lambda n: UpdateSettings(global_mini_batch_size=64).per_process(n, 8),
         "model.init_args.update.global_mini_batch_size=64"),
    ],
)  # fmt: skip
def test_a_world_size_that_does_not_divide_is_refused(build, key):
    with pytest.raises(ValueError, match=rf"{key} .* cannot be split evenly over 3 processes") as e:
        build(3)
    assert "Fix: run on a process count that divides 64" in str(e.value)
    assert "(2, 4, 8, 16, 32, 64; --trainer.devices=N)" in str(e.value)


def test_a_per_process_and_a_global_size_together_are_refused():
    with pytest.raises(ValueError, match=r"batch_size=8 \(per process\) and .* Fix: keep one"):
        DataBatchSettings(batch_size=8, global_batch_size=64)
    with pytest.raises(ValueError, match=r"mini_batch_size=8 .*global_mini_batch_size=2"):
        UpdateSettings(mini_batch_size=8, global_mini_batch_size=2)
    with pytest.raises(ValueError, match=r"global_mini_batch_size=0 must be >= 1 prompt"):
        UpdateSettings(global_mini_batch_size=0)


def test_several_steps_per_rollout_need_the_trainers_old_log_probs_at_build_time():
    """A global mini-batch means several optimizer steps: the mismatch correction's check sees
    it when the module is built, not only after setup resolves it."""
    with pytest.raises(ValueError, match=r"recompute_old_log_probs: true"):
        PPOSettings(update=UpdateSettings(global_mini_batch_size=2),
                    mismatch=MismatchSettings(correction="tis"))  # fmt: skip
    settings = PPOSettings(update=UpdateSettings(global_mini_batch_size=4))
    assert settings.per_process(2).update.mini_batch_size == 2 * 4  # 2 prompts x G = 4


def _trainer(world_size: int) -> SimpleNamespace:
    return SimpleNamespace(world_size=world_size, global_rank=0)


def test_the_prompt_data_module_divides_at_setup(tiny_model_dir):
    dm = PromptDataModule(tiny_model_dir, CountdownPrompts(num_examples=8), global_batch_size=4)
    dm.trainer = _trainer(2)  # type: ignore[assignment]
    dm.setup("fit")
    assert (dm.batch_size, dm.val_batch_size) == (2, 2)
    dm.trainer = None  # the loader without a fit loop: epoch 0
    assert len(next(iter(dm.train_dataloader()))["prompt"]) == 2
    dm.trainer = _trainer(3)  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"global_batch_size=4 rows .* over 3 processes"):
        dm.setup("fit")


def test_the_sft_data_module_divides_at_setup(tiny_model_dir, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "2+2=", "response": "4"}\n' * 8)
    dm = SFTDataModule(tiny_model_dir, str(rows), global_batch_size=8, val_batch_size=3)
    dm.trainer = _trainer(4)  # type: ignore[assignment]
    dm.setup("fit")
    assert (dm.batch_size, dm.val_batch_size) == (2, 3)
    with pytest.raises(ValueError, match=r"batch_size=2 \(per process\) and"):
        SFTDataModule(tiny_model_dir, str(rows), batch_size=2, global_batch_size=8)


def test_the_cli_runs_with_global_sizes_and_refuses_both(tmp_path):
    """As a user would: ``lit-rlhf fit`` with the global sizes (one process) logs the split;
    a global size beside the config's per-process one is refused before anything loads."""
    args = ["-m", "lit_rlhf.cli", "fit", "--config", "configs/ppo/countdown_tiny.yaml",
            "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    output = run_python(*args, "--data.init_args.batch_size=null",
                        "--data.init_args.global_batch_size=4",
                        "--model.init_args.update.global_mini_batch_size=2")  # fmt: skip
    assert "data.init_args.global_batch_size=4: 4 per process x 1 process" in output
    assert "2 prompts x 4 samples) per optimizer step on each of 1 process" in output
    refused = run_python(*args, "--data.init_args.global_batch_size=4", expect_failure=True)
    assert "data.init_args.batch_size=4 (per process) and" in refused
    assert "Fix: keep one of them" in refused
