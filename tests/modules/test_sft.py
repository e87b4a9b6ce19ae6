"""SFTModule: the loss is the token-mean NLL of the response tokens (by hand, row by row, and the
same over any micro-batch split), a tiny model memorises a small set, the exported folder gives
the same logits in transformers, an exact resume (weights, AdamW state, lr schedule), the CLI's
tokenizer link, and settings refused before any model loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlhf.cli import cli_main
from lit_rlhf.data import SFTDataModule
from lit_rlhf.data.sft import IGNORE
from lit_rlhf.modules import SFTModule
from lit_rlhf.modules.sft import micro_batches, response_token_nll
from lit_rlhf.settings import PrecisionSettings
from tests.helpers import quiet_trainer

REPO = Path(__file__).parents[2]
ROWS = [
    {"prompt": "Add 2 and 3.", "response": "5"},
    {"prompt": "Name a colour.", "response": "blue, like the sky"},
    {"prompt": "Say hello.", "response": "hello there"},
    {"messages": [{"role": "user", "content": "Count to three."},
                  {"role": "assistant", "content": "one two three"}]},
]  # fmt: skip


def _data(tmp_path: Path, batch_size: int = 4, **kwargs: Any) -> SFTDataModule:
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return SFTDataModule("builtin:tiny-llama", train=str(path), batch_size=batch_size,
                         shuffle=False, **kwargs)  # fmt: skip


def _batch(data: SFTDataModule) -> dict[str, torch.Tensor]:
    data.setup("fit")
    return next(iter(data.train_dataloader()))


def _module(data: SFTDataModule, **kwargs: Any) -> SFTModule:
    torch.manual_seed(0)
    optim = {"lr": 1e-3, **kwargs.pop("optim", {})}
    module = SFTModule(tokenizer=data.tokenizer, optim=optim, **kwargs)
    module.configure_model()
    return module


def test_the_loss_is_the_token_mean_nll_of_the_response_tokens(tmp_path: Path) -> None:
    data = _data(tmp_path)
    batch, module = _batch(data), _module(data)
    module.model.eval()
    with torch.no_grad():
        nll, trained, hits = response_token_nll(module.model, batch)
        by_hand, count = [], 0
        for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True):
            n = int((ids != data.tokenizer.pad_token_id).sum())  # each row alone, no padding
            log_probs = torch.log_softmax(module.model(ids[None, :n]).logits[0].float(), -1)
            for t in range(1, n):
                if labels[t] != IGNORE:
                    by_hand.append(-log_probs[t - 1, labels[t]])
                    count += 1
        expected = torch.stack(by_hand).mean()
        assert int(trained.sum()) == count == int((batch["labels"][:, 1:] != IGNORE).sum())
        torch.testing.assert_close(nll.sum() / trained.sum(), expected, rtol=1e-5, atol=1e-5)
        assert not nll[~trained].any() and not hits[~trained].any()
        # accumulation: micro-batches of one row, each trimmed, add up to the same mean
        parts = [response_token_nll(module.model, part)[0].sum() for part in
                 micro_batches(batch, 1)]  # fmt: skip
        torch.testing.assert_close(torch.stack(parts).sum() / count, expected, rtol=1e-5, atol=1e-5)
    assert [part["input_ids"].shape[1] for part in micro_batches(batch, 1)] == [
        int(row.sum()) for row in batch["attention_mask"]
    ]


def test_a_few_steps_memorise_a_small_set(tmp_path: Path) -> None:
    data = _data(tmp_path)
    batch, module = _batch(data), _module(data, optim={"lr": 3e-3, "micro_batch_size": 2})

    def loss() -> float:
        with torch.no_grad():
            nll, trained, _ = response_token_nll(module.model, batch)
        return float(nll.sum() / trained.sum())

    before = loss()
    quiet_trainer(tmp_path, max_epochs=30, log_every_n_steps=1).fit(module, datamodule=data)
    after = loss()
    assert module.trainer.global_step == 30
    assert after < 0.5 * before, (before, after)
    logged = module.trainer.callback_metrics
    assert float(logged["train/response_tokens"]) == int(trained_count(batch))
    assert {"train/loss", "train/lr", "train/grad_norm", "train/token_accuracy"} <= set(logged)


def trained_count(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["labels"][:, 1:] != IGNORE).sum())


def test_validation_logs_token_mean_loss_and_accuracy(tmp_path: Path) -> None:
    data = _data(tmp_path, val=str(tmp_path / "sft.jsonl"), val_split="train", val_batch_size=3)
    batch, module = _batch(data), _module(data)
    metrics = quiet_trainer(tmp_path).validate(module, datamodule=data, verbose=False)[0]
    module.model.eval()
    with torch.no_grad():  # one batch of all four rows: the same token mean as two batches
        nll, trained, hits = response_token_nll(module.model, batch)
    assert metrics["val/loss"] == pytest.approx(float(nll.sum() / trained.sum()), rel=1e-5)
    assert metrics["val/token_accuracy"] == pytest.approx(float(hits.sum() / trained.sum()))


def test_export_dir_reloads_with_identical_logits(tmp_path: Path) -> None:
    data = _data(tmp_path)
    export = tmp_path / "hf"
    batch, module = _batch(data), _module(data, export_dir=str(export))
    quiet_trainer(tmp_path, max_steps=2, max_epochs=2).fit(module, datamodule=data)
    loaded = AutoModelForCausalLM.from_pretrained(export).eval()
    module.model.eval()
    with torch.no_grad():
        mine = module.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        theirs = loaded(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert tokenizer("Say hello.")["input_ids"] == data.tokenizer("Say hello.")["input_ids"]
    assert tokenizer.chat_template == data.tokenizer.chat_template
    # and a module loads it as its model
    again = SFTModule(model=str(export))
    again.configure_model()
    assert torch.equal(again.model.lm_head.weight, loaded.lm_head.weight)


def test_fast_dev_run_exports_nothing_and_checkpointing_trains(tmp_path: Path) -> None:
    data = _data(tmp_path)
    module = _module(
        data, export_dir=str(tmp_path / "hf"), precision={"gradient_checkpointing": True}
    )
    quiet_trainer(tmp_path, fast_dev_run=True).fit(module, datamodule=data)
    assert not (tmp_path / "hf").exists()
    assert module.model.is_gradient_checkpointing and module.trainer.global_step == 1


def test_resume_restores_weights_optimizer_and_lr_schedule(tmp_path: Path) -> None:
    schedule = {"lr_warmup_steps": 1, "lr_schedule": "linear", "min_lr_ratio": 0.5,
                "micro_batch_size": 1}  # fmt: skip

    def fit(root: Path, ckpt: str | None = None) -> SFTModule:
        data = _data(tmp_path, batch_size=1)  # four batches per epoch, shuffled each epoch
        data.shuffle = True
        L.seed_everything(0)
        module = _module(data, optim=schedule)
        every = ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=3,
                                save_top_k=-1)  # fmt: skip
        L.Trainer(accelerator="cpu", max_steps=6, logger=False, default_root_dir=root,
                  enable_progress_bar=False, enable_model_summary=False,
                  callbacks=[every]).fit(module, datamodule=data, ckpt_path=ckpt)  # fmt: skip
        return module

    straight = fit(tmp_path / "a")
    fit(tmp_path / "b")
    saved = torch.load(tmp_path / "b" / "step=3.ckpt", weights_only=True)
    assert saved["optimizer_states"][0]["state"]  # AdamW moments are saved
    assert saved["lit_rlhf_optimizer_step"]["lr_schedule"]["batches"] == 3
    resumed = fit(tmp_path / "b", ckpt=str(tmp_path / "b" / "step=3.ckpt"))
    assert resumed.step_optimizer.lr.state_dict() == straight.step_optimizer.lr.state_dict()
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters(),
                            strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    lrs = [g["lr"] for g in resumed.optimizers().optimizer.param_groups]  # type: ignore[union-attr]
    assert lrs == pytest.approx([1e-3 * (1 - 0.5 * 4 / 5)])  # linear 1 -> 0.5 over steps 1..6


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"optim": {"lr": 0.0}}, r"optim\.lr=0.0 must be > 0 and finite"),
        ({"optim": {"weight_decay": -0.1}}, r"optim\.weight_decay=-0.1 must be >= 0"),
        ({"optim": {"micro_batch_size": 0}}, r"optim\.micro_batch_size=0 must be an integer >= 1"),
        ({"optim": {"max_grad_norm": 0.0}}, r"optim\.max_grad_norm=0.0 must be > 0"),
        ({"optim": {"min_lr_ratio": 0.1}}, r"optim\.min_lr_ratio=0.1 .* would do nothing"),
        (
            {"precision": {"reference_dtype": "bfloat16"}},
            r"precision\.reference_dtype='bfloat16': SFTModule has no frozen reference",
        ),
    ],
)
def test_bad_settings_are_refused_before_any_model_loads(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SFTModule(model="no/such-model", **settings)


def test_a_flat_argument_names_its_group() -> None:
    with pytest.raises(TypeError, match=r"SFTModule\(lr=\.\.\.\).* now optim\.lr"):
        SFTModule(lr=1e-3)  # type: ignore[call-arg]


def test_16_bit_weights_without_master_weights_are_refused_at_setup(tmp_path: Path) -> None:
    data = _data(tmp_path)
    module = SFTModule(tokenizer=data.tokenizer, precision=PrecisionSettings(dtype="bfloat16"))
    with pytest.raises(ValueError, match=r"model\.init_args\.precision\.dtype: bfloat16"):
        quiet_trainer(tmp_path).fit(module, datamodule=data)
    assert module.model is None  # refused before the load


def test_the_cli_hands_the_datas_tokenizer_to_the_module(tmp_path: Path) -> None:
    cli = cli_main(["--config", str(REPO / "configs/sft/tiny.yaml"), "--trainer.logger=false",
                    f"--trainer.default_root_dir={tmp_path}"], run=False)  # fmt: skip
    assert isinstance(cli.model, SFTModule) and isinstance(cli.datamodule, SFTDataModule)
    assert cli.model.tokenizer is cli.datamodule.tokenizer
