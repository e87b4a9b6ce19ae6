"""A few dozen steps of compressor training on the tiny CPU setting lower the reconstruction
loss and raise ROUGE-L on held-out contexts. The frozen decoder is the tiny Llama given the
sample's language first (``pretrain_on_texts``): a random frozen decoder cannot be steered."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

from lit_rlhf.data import PromptDataModule, TextChunks
from lit_rlhf.metrics.fidelity import ReconstructionFidelity
from lit_rlhf.models.pretrain import pretrain_on_texts
from lit_rlhf.modules import CompressorDecoderModule

SAMPLE = Path(__file__).parents[2] / "lit_rlhf" / "data" / "samples" / "text_sample.jsonl"


def _evaluate(module: CompressorDecoderModule, data: PromptDataModule) -> tuple[float, ...]:
    """(autoencoding loss per token, ROUGE-L, memory gain) over the validation contexts."""
    module.eval()
    fidelity, loss_sum, count, gains = ReconstructionFidelity(), 0.0, 0.0, []
    with torch.no_grad():
        for batch in data.val_dataloader():
            out = module.losses(batch)
            loss_sum, count = loss_sum + float(out["ae_sum"]), count + float(out["ae_count"])
            gains.append(float(module.memory_gain(out)))
            result = module._evaluate_outputs(batch, out)
            fidelity.update(result["reconstructions"], result["references"])
    module.train()
    return loss_sum / count, float(fidelity.compute()["rougeL"]), sum(gains) / len(gains)


def test_training_lowers_reconstruction_loss_and_raises_rouge_l(tmp_path: Path) -> None:
    texts = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()]
    torch.set_num_threads(1)
    decoder = pretrain_on_texts("builtin:tiny-llama", texts, tmp_path / "decoder", steps=300,
                                copy_fraction=0.5, seed=0)  # fmt: skip
    chunks = {"path": str(SAMPLE), "context_tokens": 16, "continuation_tokens": 0}
    data = PromptDataModule(tokenizer=str(decoder), batch_size=8,
                            train=TextChunks(**chunks, max_chunks=2000, seed=0),  # type: ignore[arg-type]
                            val=TextChunks(**chunks, max_chunks=32, seed=1))  # type: ignore[arg-type]  # fmt: skip
    L.seed_everything(0)
    module = CompressorDecoderModule(
        compressor=str(decoder), decoder=str(decoder), tokenizer=data.tokenizer,
        num_memory_tokens=8, optim={"lr": 1e-2},
    )  # fmt: skip
    module.configure_model()
    data.setup("fit")
    loss_before, rouge_before, gain_before = _evaluate(module, data)
    L.Trainer(accelerator="cpu", max_steps=400, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False,
              limit_val_batches=0).fit(module, datamodule=data)  # fmt: skip
    loss_after, rouge_after, gain_after = _evaluate(module, data)
    print(loss_before, rouge_before, gain_before, loss_after, rouge_after, gain_after)
    assert loss_after < loss_before - 0.1
    assert rouge_after > rouge_before + 0.02
    # the memory now carries this context: another context's memory reconstructs it worse
    assert gain_after > gain_before + 0.05
