"""Resume from a checkpoint taken in the middle of an epoch: the run continues with the next
unseen batch (the train loader's position is in the checkpoint), with the step counters carried
on, instead of restarting the epoch and training on its first batches twice."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.data import CountdownPrompts, PromptDataModule
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from tests.helpers import ConstantReward, quiet_trainer


class RecordAndSave(L.Callback):
    """Records each training batch's prompt ids; saves a checkpoint at optimizer step ``at``."""

    def __init__(self, path=None, at=None):
        self.path, self.at, self.batches = path, at, []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches.append(list(batch["query_id"]))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.at:
            trainer.save_checkpoint(self.path)


def fit(model_dir, root, callback, ckpt_path=None):
    torch.manual_seed(0)
    data = PromptDataModule(
        tokenizer=model_dir,
        train=CountdownPrompts(num_examples=10, seed=0),
        batch_size=2,
        use_chat_template=False,
    )
    module = PPOModule(
        reward=ConstantReward(1.0),
        model=model_dir,
        tokenizer=data.tokenizer,
        engine=HFGenerationEngine(max_new_tokens=4),
        rollout={"samples_per_prompt": 2},
    )
    trainer = quiet_trainer(root, max_epochs=2, num_sanity_val_steps=0, callbacks=[callback])
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, module


@pytest.mark.parametrize("at", [2, 7], ids=["epoch0-step2", "epoch1-step7"])
def test_mid_epoch_resume_continues_with_the_next_batch(tiny_model_dir, tmp_path, at):
    ckpt = tmp_path / "mid.ckpt"
    first = RecordAndSave(ckpt, at=at)  # 2 epochs x 5 batches, one optimizer step each
    full_trainer, full_module = fit(tiny_model_dir, tmp_path, first)
    assert len(first.batches) == 10 and full_trainer.global_step == 10
    # the two epochs are shuffled differently, so a replayed order could not pass unnoticed
    assert first.batches[:5] != first.batches[5:]

    again = RecordAndSave()
    trainer, module = fit(tiny_model_dir, tmp_path, again, ckpt_path=ckpt)
    assert again.batches == first.batches[at:]  # the next unseen batch onwards, none repeated
    assert trainer.global_step == full_trainer.global_step == 10
    assert module.rollout_step == full_module.rollout_step == 10
