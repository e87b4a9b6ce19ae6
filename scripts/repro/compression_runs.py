"""The pieces of the compression comparison (``scripts/repro/compression.py``): the training and
evaluation passages, one compressor's training and validation, the compressors' own priors on the
probe facts, the decoder's no-memory loss, and the figures read off a run.

A run is described by one dict (``model``, ``data``, ``train_text``, ``val_text``, ``trainer``:
the keyword arguments of ``CompressorDecoderModule``, ``PromptDataModule``, the two
``TextChunks`` and ``lightning.Trainer``), whether it comes from a GPU preset config or from the
CPU settings, so every preset trains and validates through the same code.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DRIFT_KINDS = ("role", "negation", "order")
# memory gain (nats per token: another passage's memory minus the passage's own) above which a
# compressor counts as encoding its passage; a trained memory can beat the no-memory loss by
# learning the passages' template alone, with no gain (measured: 3.87 vs 4.46, gain -0.002)
ENCODES_GAIN = 0.05


# ------------------------------------------------------------------ passages
def probe_items(probes: int, seed: int) -> list[dict[str, Any]]:
    """``probes`` overwrite items and ``probes`` drift items drawn with ``seed``."""
    from lit_rlhf.data.probes import make_probes

    return make_probes("overwrite", probes, seed=seed) + make_probes("drift", probes, seed=seed)


def train_passages(count: int, seed: int, avoid: Sequence[str]) -> list[str]:
    """``count`` training passages: probe contexts (half counterfactual facts, half role /
    negation / order items) drawn with ``seed``, shuffled by it, none equal to a text of
    ``avoid`` (the evaluation passages; their seed must differ from ``seed``)."""
    half = max(1, (count + 1) // 2)
    items = probe_items(half, seed)
    held_out = set(avoid)
    texts = [item["context"] for item in items if item["context"] not in held_out]
    random.Random(seed).shuffle(texts)
    return texts[:count]


def write_passages(path: Path, texts: Sequence[str]) -> Path:
    """One JSONL row ``{"text": ...}`` per passage (one ``TextChunks`` document each)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


# ------------------------------------------------------------------ settings
def preset_run(path: Path) -> dict[str, Any]:
    """One run's settings, exactly as the preset config ``path`` gives them: the module's
    arguments, the data module's, both text sources' and the trainer's."""
    config = yaml.safe_load(path.read_text())
    data = copy.deepcopy(config["data"]["init_args"])
    train, val = data.pop("train")["init_args"], data.pop("val")["init_args"]
    keys = ("accelerator", "devices", "precision", "max_steps")
    return {
        "config": str(path.relative_to(REPO)),
        "model": copy.deepcopy(config["model"]["init_args"]),
        "data": data,
        "train_text": train,
        "val_text": val,
        "trainer": {k: config["trainer"][k] for k in keys},
    }


def config_probes(path: Path) -> int:
    """The ``probes`` of the config's ``CompressionDiagnostics`` callback."""
    callbacks = yaml.safe_load(path.read_text())["trainer"]["callbacks"]
    return int(
        next(c["init_args"]["probes"] for c in callbacks if "Compression" in c["class_path"])
    )


def cpu_run(settings: dict[str, Any], layers: int, train: Path, val: Path) -> dict[str, Any]:
    """The run dict of one CPU / smoke compressor of ``layers`` layers."""
    from lit_rlhf.training.precision import resolve_precision

    precision = str(resolve_precision(settings["precision"], "cpu"))
    decoder_dtype = "bfloat16" if precision.startswith("bf16") else "float32"
    chunks = {"context_tokens": settings["context_tokens"], "continuation_tokens": 0}
    chunks |= {"min_context_tokens": 1}
    model: dict[str, Any] = {"compressor": settings["compressor"], "decoder": settings["decoder"]}
    model |= {"compressor_layers": layers, "num_memory_tokens": settings["memory_tokens"]}
    lora = {"rank": settings["lora_rank"], "alpha": settings["lora_alpha"]}
    model["lora"] = lora | {"target_modules": settings["lora_target_modules"]}
    model["optim"] = {"lr": settings["lr"], "micro_batch_size": settings["batch_size"]}
    model["optim"] |= {"max_grad_norm": 1.0}
    model |= {"precision": {"dtype": "float32"}, "decoder_dtype": decoder_dtype}
    model |= {"max_new_tokens": settings["max_new_tokens"]}
    return {
        "config": None,
        "model": model,
        "data": {"tokenizer": settings["decoder"], "batch_size": settings["batch_size"]},
        "train_text": {"path": str(train), **chunks, "seed": 0},
        "val_text": {"path": str(val), **chunks, "seed": 0},
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "precision": precision,
            "max_steps": settings["steps"],
        },
    }


# ------------------------------------------------------------------ one run
def _loss_trace() -> Any:
    """A callback collecting ``train/ae_loss`` after every training batch."""
    import lightning as L

    class LossTrace(L.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            self.losses.append(float(trainer.callback_metrics["train/ae_loss"]))

    return LossTrace()


def build(run: dict[str, Any], seed: int, probes: int, probe_seed: int) -> tuple[Any, ...]:
    """(data module, module, training trainer, validation trainer, loss trace) of one run, from
    its settings alone plus the seed and the evaluation probes (count per kind, seed)."""
    import lightning as L

    from lit_rlhf.callbacks import CompressionDiagnostics
    from lit_rlhf.data import PromptDataModule, TextChunks
    from lit_rlhf.modules import CompressorDecoderModule

    data = PromptDataModule(
        **run["data"],
        seed=seed,
        train=TextChunks(**run["train_text"]),
        val=TextChunks(**run["val_text"]),
    )
    module = CompressorDecoderModule(**run["model"], tokenizer=data.tokenizer)
    quiet: dict[str, Any] = {"logger": False, "enable_progress_bar": False}
    quiet["enable_model_summary"] = False
    trace = _loss_trace()
    trainer = L.Trainer(
        **run["trainer"], **quiet, enable_checkpointing=False, limit_val_batches=0,
        callbacks=[trace],
    )  # fmt: skip
    hardware = {k: run["trainer"][k] for k in ("accelerator", "devices", "precision")}
    diagnostics = CompressionDiagnostics(probes=probes, probe_seed=probe_seed)
    validator = L.Trainer(**hardware, **quiet, callbacks=[diagnostics])
    return data, module, trainer, validator, trace


def train_and_evaluate(
    run: dict[str, Any], seed: int, probes: int, probe_seed: int,
    keep: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train one compressor, validate it (losses, erank, entropy, fidelity, probes) and
    measure the decoder's no-memory loss on the probe passages (the CPU presets' validation
    passages). ``keep``: gets the trained module under ``"module"``, for more measurements."""
    import lightning as L

    flush_denormals()
    L.seed_everything(seed, verbose=False)
    data, module, trainer, validator, trace = build(run, seed, probes, probe_seed)
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    train_seconds = time.perf_counter() - start
    (metrics,) = validator.validate(module, datamodule=data, verbose=False)
    if keep is not None:
        keep["module"] = module
    texts = [item["context"] for item in probe_items(probes, probe_seed)]
    return {
        "metrics": {k: float(v) for k, v in metrics.items()},
        "no_memory_loss": no_memory_loss(module.decoder, module.tokenizer, texts),
        "losses": trace.losses,
        "train_seconds": train_seconds,
    }


def flush_denormals() -> None:
    """Flush denormal floats to zero on the CPU (process-wide): the 30-layer compressor's
    backward produced denormals that slowed a CPU step about 8x (83 s -> 10 s measured, bf16
    autocast, loaded machine); values below 1e-38 change nothing a loss can see."""
    import torch

    torch.set_flush_denormal(True)


# ------------------------------------------------------------------ figures
def drifted_rate(metrics: dict[str, float]) -> float:
    """The mean of the role, negation and order "drifted" rates present (NaN when none)."""
    rates = [
        metrics[f"val/probe/{k}/drifted"]
        for k in DRIFT_KINDS
        if f"val/probe/{k}/drifted" in metrics
    ]
    return sum(rates) / len(rates) if rates else math.nan


def run_figures(result: dict[str, Any], every: int) -> dict[str, Any]:
    """The table's figures of one run and its training-loss curve (mean of each ``every``
    steps); ``encodes`` is 1 when the memory gain exceeds ``ENCODES_GAIN``."""
    m = result["metrics"]
    nan = math.nan
    figures: dict[str, Any] = {
        "train_ae_loss": mean_tail(result["losses"], every),
        "val_ae_loss": m.get("val/ae_loss", nan),
        "no_memory_loss": result["no_memory_loss"],
        "memory_gain": m.get("val/memory_gain", nan),
        "overwritten": m.get("val/probe/overwrite/overwritten", nan),
        "kept": m.get("val/probe/overwrite/kept", nan),
        "drifted": drifted_rate(m),
        "rougeL": m.get("val/rougeL", nan),
        "effective_rank": m.get("val/effective_rank", nan),
        "decoder_entropy": m.get("val/decoder_entropy", nan),
        "train_seconds": result["train_seconds"],
    }
    figures["encodes"] = float(figures["memory_gain"] > ENCODES_GAIN)
    figures["curves"] = {"train_ae_loss": binned(result["losses"], every)}
    return figures


def mean_tail(values: Sequence[float], n: int) -> float:
    """The mean of the last ``n`` values (NaN for none)."""
    tail = list(values)[-max(n, 1) :]
    return sum(tail) / len(tail) if tail else math.nan


def binned(values: Sequence[float], every: int) -> list[list[float]]:
    """``[[last step of the bin, mean of the bin], ...]`` over bins of ``every`` steps (steps
    count from 1; a short last bin is kept)."""
    every = max(every, 1)
    out = []
    for start in range(0, len(values), every):
        chunk = list(values[start : start + every])
        out.append([float(start + len(chunk)), sum(chunk) / len(chunk)])
    return out


# ------------------------------------------------------------------ decoder / prior scoring
def no_memory_loss(decoder: Any, tokenizer: Any, texts: Sequence[str]) -> float:
    """The frozen decoder's teacher-forced loss per token of ``texts`` (each + EOS, as the
    autoencoding targets) read after the EOS token's embedding alone: what a decoder makes of
    the passage with no memory. A compressor whose ``val_ae_loss`` is not below it has not
    learnt to encode."""
    import torch

    from lit_rlhf.data.prompts import pad_ids
    from lit_rlhf.models.compressor import (
        autoencoding_targets,
        target_loss,
        teacher_forced_logits,
    )

    pad, eos = int(tokenizer.pad_token_id), int(tokenizer.eos_token_id)
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    ids, mask = pad_ids(encoded, pad, "left")
    device = next(decoder.parameters()).device
    with torch.no_grad():
        targets, target_mask = autoencoding_targets(ids, mask, pad_id=pad, eos_id=eos)
        targets, target_mask = targets.to(device), target_mask.to(device)
        start = torch.full((len(encoded), 1), eos, device=device)
        prefix = decoder.get_input_embeddings()(start)
        logits = teacher_forced_logits(decoder, prefix, targets, target_mask)
        total, count = target_loss(logits, targets, target_mask)
    return float(total / count.clamp(min=1))


def fact_stem(item: dict[str, Any]) -> str:
    """The counterfactual sentence of an overwrite item up to its value ("The strawberries in
    Mira's garden are"), found in the item's context."""
    ending = f" {item['fact']}."
    for sentence in item["context"].split(". "):
        sentence = sentence if sentence.endswith(".") else sentence + "."
        if sentence.endswith(ending) and item["subject"] in sentence:
            return sentence[: -len(ending)]
    raise ValueError(f"no sentence ending in {ending!r} in {item['context']!r}")


def value_logprob(model: Any, tokenizer: Any, stem: str, value: str) -> float:
    """log p(" value" | stem) under the causal LM ``model``, summed over the value's tokens."""
    import torch

    stem_ids = tokenizer(stem, add_special_tokens=False)["input_ids"]
    value_ids = tokenizer(" " + value, add_special_tokens=False)["input_ids"]
    device = next(model.parameters()).device
    ids = torch.tensor([stem_ids + value_ids], device=device)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    start = len(stem_ids)
    return float(sum(logp[0, start - 1 + i, t] for i, t in enumerate(value_ids)))


def prior_margins(model: Any, tokenizer: Any, items: Sequence[dict[str, Any]]) -> list[float]:
    """Per overwrite item: log p(prior value) - log p(counterfactual value) after the fact's
    stem, under ``model`` as a plain LM: > 0 where the model's prior would overwrite the
    context's fact."""
    margins = []
    for item in items:
        stem = fact_stem(item)
        prior = value_logprob(model, tokenizer, stem, item["prior"])
        margins.append(prior - value_logprob(model, tokenizer, stem, item["fact"]))
    return margins


def prior_summary(margins: Sequence[float]) -> dict[str, float]:
    """Mean margin (nats) and the share of items whose prior is preferred (margin > 0)."""
    if not margins:
        return {"prior_margin": math.nan, "prior_preferred": math.nan}
    return {
        "prior_margin": sum(margins) / len(margins),
        "prior_preferred": sum(m > 0 for m in margins) / len(margins),
    }
