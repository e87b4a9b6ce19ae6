"""CompressorDecoderModule: settings refused before any model loads, the projection between
widths, the frozen decoder out of checkpoints, an exact resume (memory embeddings, projection,
markers, optimizer), LoRA, and the losses' arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlhf.data import PromptDataModule, TextChunks
from lit_rlhf.models.tiny import TinyModelSpec, write_tiny_model
from lit_rlhf.modules import CompressorDecoderModule
from lit_rlhf.settings import LoRASettings

SAMPLE = Path(__file__).parents[2] / "lit_rlhf" / "data" / "samples" / "text_sample.jsonl"


def _data(batch_size: int = 4) -> PromptDataModule:
    chunks = TextChunks(path=str(SAMPLE), context_tokens=16, continuation_tokens=8, max_chunks=32)
    return PromptDataModule(tokenizer="builtin:tiny-llama", train=chunks, batch_size=batch_size,
                            shuffle=False)  # fmt: skip


def _module(data: PromptDataModule, **kwargs: Any) -> CompressorDecoderModule:
    optim = {"lr": 1e-3, "micro_batch_size": 2, **kwargs.pop("optim", {})}
    settings: dict[str, Any] = {"num_memory_tokens": 4, "lm_weight": 0.5, **kwargs}
    return CompressorDecoderModule(tokenizer=data.tokenizer, optim=optim, **settings)


def _trainer(root: Path, steps: int, callbacks: list | None = None) -> L.Trainer:  # type: ignore[type-arg]
    return L.Trainer(accelerator="cpu", max_steps=steps, logger=False, default_root_dir=root,
                     enable_progress_bar=False, enable_model_summary=False,
                     limit_val_batches=0, callbacks=callbacks)  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"num_memory_tokens": 4, "compression_rate": 4.0}, "either num_memory_tokens"),
        ({"num_memory_tokens": None}, "number of memory tokens is unset"),
        ({"num_memory_tokens": 0}, "num_memory_tokens must be >= 1"),
        (
            {"num_memory_tokens": None, "compression_rate": -2.0, "context_tokens": 32},
            "compression_rate must be > 0",
        ),
        ({"optim": {"lr": -1e-4}}, r"optim\.lr=-0.0001 must be .*a negative lr would ascend"),
        ({"ae_weight": 0.0, "lm_weight": 0.0}, "not both 0"),
        ({"lm_weight": -1.0}, "must be >= 0"),
        ({"lora": {"rank": -1}}, r"lora\.rank=-1 must be an integer >= 0"),
        ({"lora": {"rank": 4, "dropout": 1.0}}, r"lora\.dropout=1.0 must be in \[0, 1\)"),
        ({"lora": {"rank": 4, "quantize": "4bit"}}, r"lora\.quantize='4bit': CompressorDecoder"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ({"optim": {"micro_batch_size": 0}}, r"optim\.micro_batch_size=0 must be an integer >= 1"),
        ({"compressor_layers": 0}, "compressor_layers must be >= 1"),
        (
            {"precision": {"gradient_checkpointing": True}},
            r"precision\.gradient_checkpointing: CompressorDecoderModule does not checkpoint",
        ),
        (
            {"precision": {"reference_dtype": "bfloat16"}},
            r"precision\.reference_dtype='bfloat16': CompressorDecoderModule has no frozen",
        ),
    ],
)
def test_bad_settings_are_refused_before_any_model_loads(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CompressorDecoderModule(compressor="no/such-model", decoder="no/such-model", **settings)


def test_a_flat_argument_names_its_group() -> None:
    with pytest.raises(TypeError, match=r"\(lora_dropout=\.\.\.\).* now lora\.dropout"):
        CompressorDecoderModule(lora_dropout=0.05)  # type: ignore[call-arg]


def test_compression_rate_sets_k() -> None:
    module = CompressorDecoderModule(num_memory_tokens=None, compression_rate=8, context_tokens=32)
    assert module.k == 4


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        (64, r"compression_rate=64 on context_tokens=32 gives 1 memory token\(s\), an "
         r"effective rate of 32, not 64"),
        (6, r"compression_rate=6 on context_tokens=32 gives 6 memory token\(s\), an "
         r"effective rate of 5\.33333, not 6"),
    ],
)  # fmt: skip
def test_a_rate_the_context_cannot_give_is_refused_with_both_numbers(rate, message) -> None:
    with pytest.raises(ValueError, match=message):
        CompressorDecoderModule(
            compressor="no/such-model", num_memory_tokens=None, compression_rate=rate,
            context_tokens=32,
        )  # fmt: skip


def test_the_cli_refuses_rate_64_on_32_token_chunks_before_training(tmp_path: Path) -> None:
    from lit_rlhf.cli import cli_main

    config = str(Path(__file__).resolve().parents[2] / "configs/compressor/tiny.yaml")
    common = ["fit", "--config", config, f"--trainer.default_root_dir={tmp_path}"]
    with pytest.raises(ValueError, match=r"compression_rate=64 on context_tokens=32") as info:
        cli_main([*common, "--model.init_args.compression_rate=64"])
    assert "effective rate of 32, not 64" in str(info.value).splitlines()[-1]
    # the data's chunks longer than the module's context: refused in setup, before any load
    longer = "--data.init_args.train.init_args.context_tokens=64"
    with pytest.raises(
        ValueError,
        match=r"the train data's context_tokens=64 differs from the module's context_tokens=32 "
        r"\(compression_rate=8 -> 4 memory tokens, an effective rate of 16 on this data\)",
    ):
        cli_main([*common, longer])


def test_compressor_layers_keeps_the_first_layers_of_the_compressor_only() -> None:
    data = _data()
    data.setup("fit")
    module = _module(data, compressor_layers=1)
    module.configure_model()
    assert module.compressor is not None
    lm, decoder = module.compressor.lm, module.decoder
    assert len(lm.model.layers) == 1 and len(decoder.model.layers) == 2  # tiny-llama: 2
    assert torch.equal(
        lm.model.layers[0].mlp.up_proj.weight, decoder.model.layers[0].mlp.up_proj.weight
    )
    batch = next(iter(data.train_dataloader()))
    assert module.compress(batch["input_ids"], batch["attention_mask"]).shape == (4, 4, 64)
    with pytest.raises(ValueError, match=r"num_layers=3 but 'builtin:tiny-llama' has 2 layers"):
        _module(data, compressor_layers=3).configure_model()


def test_a_wider_compressor_is_projected_to_the_decoder_width(tmp_path: Path) -> None:
    wide = write_tiny_model(tmp_path / "wide", TinyModelSpec(hidden_size=96, num_heads=4))
    data = _data()
    data.setup("fit")
    module = _module(data, compressor=str(wide))
    module.configure_model()
    assert isinstance(module.compressor.projection, torch.nn.Linear)  # type: ignore[union-attr]
    batch = next(iter(data.train_dataloader()))
    memory = module.compress(batch["input_ids"], batch["attention_mask"])
    assert memory.shape == (4, 4, module.decoder.config.hidden_size)


def _autoencoding_batch() -> tuple[PromptDataModule, CompressorDecoderModule, dict, dict]:
    """A fresh autoencoding-only module, its first training batch and that batch's losses."""
    data = _data()
    data.setup("fit")
    module = _module(data, lm_weight=0.0)
    module.configure_model()
    batch = next(iter(data.train_dataloader()))
    return data, module, batch, module.losses(batch)


def test_the_autoencoding_loss_is_the_token_mean_over_context_and_eos() -> None:
    data, _, _, out = _autoencoding_batch()
    # every context has 16 tokens, plus the EOS the reconstruction ends with
    assert int(out["ae_count"]) == 4 * (16 + 1)
    logits, ids, mask = out["ae_logits"], out["ae_ids"], out["ae_mask"]
    assert (ids[:, 16] == data.tokenizer.eos_token_id).all() and mask.all()
    by_hand = -torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).sum()
    torch.testing.assert_close(out["ae_sum"], by_hand)


def test_target_log_probs_score_texts_from_the_memory_as_the_autoencoding_loss_does() -> None:
    data, module, batch, out = _autoencoding_batch()
    tok = data.tokenizer
    rows = [ids[m] for ids, m in zip(batch["input_ids"], batch["attention_mask"], strict=True)]
    contexts = [tok.decode(ids) for ids in rows]
    assert tok(contexts, add_special_tokens=False)["input_ids"] == [ids.tolist() for ids in rows]
    # target = the context itself: its tokens' log-probs are the autoencoding loss's, less EOS
    got = module.target_log_probs(contexts, contexts)
    assert [len(g) for g in got] == [16] * 4
    ae = -torch.nn.functional.cross_entropy(
        out["ae_logits"].float().flatten(0, 1), out["ae_ids"].flatten(), reduction="none"
    ).view_as(out["ae_ids"])
    torch.testing.assert_close(torch.stack(got), ae[:, :16], atol=1e-4, rtol=1e-4)
    # another context's memory scores the same text differently; lengths follow the targets
    swapped = module.target_log_probs(contexts[::-1], contexts)
    assert not torch.allclose(torch.stack(swapped), torch.stack(got))
    short = module.target_log_probs(contexts[:2], ["a b", "c"])
    assert [len(s) for s in short] == [
        len(tok("a b", add_special_tokens=False)["input_ids"]),
        len(tok("c", add_special_tokens=False)["input_ids"]),
    ]
    with pytest.raises(ValueError, match="2 contexts but 1 targets"):
        module.target_log_probs(contexts[:2], contexts[:1])


def test_checkpoints_leave_out_the_decoder_and_resume_exactly(tmp_path: Path) -> None:
    def fit(steps: int, root: Path, ckpt: str | None = None) -> CompressorDecoderModule:
        data = _data()
        L.seed_everything(0)
        module = _module(data)
        # saved during training, as a real run does (a checkpoint written after fit has ended
        # holds no data position, and a resume from it would restart the epoch)
        every = ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=2,
                                save_top_k=-1)  # fmt: skip
        _trainer(root, steps, [every]).fit(module, datamodule=data, ckpt_path=ckpt)
        return module

    straight = fit(4, tmp_path / "a")
    fit(2, tmp_path / "b")
    saved = torch.load(tmp_path / "b" / "step=2.ckpt", weights_only=True)
    keys = list(saved["state_dict"])
    assert not [k for k in keys if k.startswith("decoder.")]
    assert {"compressor.memory", "compressor.markers"} <= set(keys)
    assert saved["optimizer_states"][0]["state"]  # AdamW moments are saved
    resumed = fit(4, tmp_path / "b", ckpt=str(tmp_path / "b" / "step=2.ckpt"))
    assert resumed.compressor is not None and straight.compressor is not None
    for (name, a), b in zip(straight.compressor.named_parameters(),
                            resumed.compressor.parameters(), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)


def test_training_moves_only_the_compressor(tmp_path: Path) -> None:
    data = _data()
    module = _module(data)
    module.configure_model()
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    _trainer(tmp_path, 2).fit(module, datamodule=data)
    for name, param in module.named_parameters():
        moved = not torch.equal(param.detach(), before[name])
        assert moved != name.startswith("decoder."), name


def test_lora_trains_adapters_memory_projection_and_markers_only(tmp_path: Path) -> None:
    pytest.importorskip("peft", reason="LoRA needs the [lora] extra")
    data = _data()
    module = _module(data, lora={"rank": 4})
    module.configure_model()
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(
        "lora_" in n or n in ("compressor.memory", "compressor.markers") for n in trainable
    ), trainable
    _trainer(tmp_path, 1).fit(module, datamodule=data)


def test_lora_dropout_reaches_the_adapters() -> None:
    pytest.importorskip("peft", reason="LoRA needs the [lora] extra")
    module = _module(_data(), lora=LoRASettings(rank=4, dropout=0.05))  # ICAE's rate
    module.configure_model()
    dropouts = [m for n, m in module.named_modules() if n.endswith("lora_dropout.default")]
    assert dropouts and all(isinstance(m, torch.nn.Dropout) and m.p == 0.05 for m in dropouts)


def test_continuation_loss_needs_continuations() -> None:
    chunks = TextChunks(path=str(SAMPLE), context_tokens=16, max_chunks=8)
    data = PromptDataModule(tokenizer="builtin:tiny-llama", train=chunks, batch_size=4)
    module = _module(data, lm_weight=1.0)
    with pytest.raises(ValueError, match="continuation_tokens > 0"):
        _trainer(Path("."), 1).fit(module, datamodule=data)
