"""The size-fidelity paradox (arXiv 2602.09789): do larger compressors, whose own priors about
the world are stronger, overwrite a context's counterfactual facts more often when the frozen
decoder reconstructs the context from their memory?

    python scripts/reproduce.py compression --preset cpu      # pre-check + 3 sizes x 3 seeds
    python scripts/reproduce.py compression --precheck-only   # the compressors' priors alone
    python scripts/reproduce.py compression --preset gpu --print-settings
    python scripts/reproduce.py compression --smoke           # tiny random models, plumbing

CPU: one frozen decoder, SmolLM2-135M-Instruct (embedded); compressors = the same model cut to
its first 4 / 10 / 30 layers (``CompressorDecoderModule(compressor_layers=...)``: embeddings,
final norm and vocabulary kept, so every size shares the decoder's vocabulary and carries part
of its priors), each trained through LoRA adapters plus the memory embeddings on passages that
hold counterfactual probe facts and role / negation / order items (``lit_rlhf.data.probes``,
drawn with seed 1000 + the run's seed); evaluated on the probe items of seed 0 (disjoint seeds,
and any evaluation passage that a training seed happens to draw is dropped from training).
Pre-check: each compressor's own prior on the evaluation facts as a plain LM, log p(prior
value) - log p(counterfactual value) after the fact's stem; go when it grows from the smallest
to the largest compressor. Per size: reconstruction loss against the decoder's no-memory loss,
memory gain, overwritten / kept / drifted rates, effective rank of the memory, the decoder's
entropy. Primary: overwritten rate, largest minus smallest compressor, expected > 0.
GPU: the presets ``configs/compressor/qwen2.5_{0.5b,1.5b,7b}.yaml`` (ICAE's recipe on MiniPile).
"""

from __future__ import annotations

import copy
import time
from typing import Any, ClassVar

from repro.common import Context, Figures, Paper, Preset, Primary
from repro.compression_runs import (
    REPO,
    config_probes,
    cpu_run,
    flush_denormals,
    preset_run,
    prior_margins,
    prior_summary,
    probe_items,
    run_figures,
    train_and_evaluate,
    train_passages,
    write_passages,
)
from repro.intervals import Kind, bounded, count

ARMS = ("small", "mid", "large")
TRAIN_SEED_OFFSET = 1000  # training passages: seed 1000 + run seed; evaluation: probe_seed
SMOLLM2 = "builtin:smollm2-135m-instruct"
_LORA = {"lora_rank": 16, "lora_alpha": 32, "lora_target_modules": "all-linear"}
_CPU: dict[str, Any] = {
    "compressor": SMOLLM2,
    "decoder": SMOLLM2,
    "sizes": {"small": 4, "mid": 10, "large": 30},  # layers kept of SmolLM2's 30
    **_LORA,
    "lr": 1e-3,
    "memory_tokens": 8,
    "context_tokens": 56,  # every probe passage whole (23-52 SmolLM2 tokens)
    "batch_size": 8,
    "steps": 200,  # sized on the pre-check's step times alone: 0.95 + 1.23 + 2.18 s per step
    "max_new_tokens": None,  # reconstructions up to the passage's length + 8
    "probes": 24,  # evaluation items per kind (overwrite, drift)
    "probe_seed": 0,
    "precision": "auto",
    "require_prior_growth": True,
    "curve_every": 10,
}
_SMOKE: dict[str, Any] = {
    **_CPU,
    "compressor": "builtin:tiny-llama",
    "decoder": "builtin:tiny-llama",
    "sizes": {"small": 1, "mid": 1, "large": 2},  # of tiny-llama's 2 layers
    "lora_rank": 0,
    "lr": 1e-2,
    "memory_tokens": 4,
    "batch_size": 4,
    "steps": 2,
    "context_tokens": 24,  # passages cut into chunks: plumbing only
    "max_new_tokens": 12,
    "precision": "32-true",
    "probes": 2,
    "require_prior_growth": False,  # random weights: no prior to grow
    "curve_every": 1,
}
GPU_CONFIGS = {
    arm: f"configs/compressor/qwen2.5_{size}.yaml"
    for arm, size in zip(ARMS, ("0.5b", "1.5b", "7b"), strict=True)
}


def gpu_settings() -> dict[str, Any]:
    """The GPU preset: exactly the three Qwen2.5 compressor presets, one per arm."""
    runs = {arm: preset_run(REPO / path) for arm, path in GPU_CONFIGS.items()}
    decoders = {run["model"]["decoder"] for run in runs.values()}
    if len(decoders) != 1:
        raise ValueError(f"the GPU presets name several decoders: {sorted(decoders)}")
    probes = config_probes(REPO / GPU_CONFIGS["small"])
    return {
        "decoder": decoders.pop(),
        "sizes": {"small": 0.5, "mid": 1.5, "large": 7.0},  # billions of parameters
        "probes": probes,
        "probe_seed": 0,
        "require_prior_growth": True,
        "curve_every": 100,
        "runs": runs,
    }


class CompressionPaper(Paper):
    name = "compression"
    title = "Size-fidelity paradox: compressor size vs overwriting and drift (arXiv 2602.09789)"
    doc = "docs/compressor.md"
    arms = ARMS
    primary = Primary("overwritten", "large", "small", +1)
    presets: ClassVar[dict[str, Preset]] = {
        "cpu": Preset("cpu", (0, 1, 2), 60.0, _CPU),
        # unmeasured: a guess of a day per (size, seed) on one 80 GB GPU (5000 x 256 contexts)
        "gpu": Preset("gpu", (0, 1, 2), 9 * 24 * 60.0, gpu_settings()),
        "smoke": Preset("smoke", (0, 1), 1.0, _SMOKE),
    }
    table_metrics = (
        "size", "train_ae_loss", "val_ae_loss", "no_memory_loss", "memory_gain", "overwritten",
        "kept", "drifted", "rougeL", "effective_rank", "decoder_entropy", "encodes",
    )  # fmt: skip
    curve_keys = ("train_ae_loss", "overwritten vs size", "drifted vs size")
    # overwritten / kept: counts out of the overwrite facts; a collapsed run counts as every
    # fact overwritten, none kept (repro.intervals)
    metric_kinds: ClassVar[dict[str, Kind]] = {
        "overwritten": count("overwrite_facts", worst=1.0),
        "kept": count("overwrite_facts"),
        "drifted": bounded(0.0, 1.0, worst=1.0),
        "encodes": bounded(0.0, 1.0),
    }
    curve_xlabels: ClassVar[dict[str, str]] = {
        "overwritten vs size": "compressor size",
        "drifted vs size": "compressor size",
    }

    def precheck(self, ctx: Context) -> Figures:
        s = ctx.settings
        items = [i for i in probe_items(s["probes"], s["probe_seed"]) if i["kind"] == "overwrite"]
        figures: Figures = {}
        for arm in self.arms:
            ctx.log(f"pre-check: the {arm} compressor's prior on {len(items)} facts")
            figures[arm] = _arm_prior(self._run(ctx, arm, seed=0), items)
        small, large = figures["small"]["prior_margin"], figures["large"]["prior_margin"]
        grows = large > small
        figures["go"] = grows or not s["require_prior_growth"]
        figures["reason"] = (
            f"prior margin log p(prior) - log p(fact): {small:.2f} ({self.arms[0]}) -> "
            f"{figures['mid']['prior_margin']:.2f} -> {large:.2f} ({self.arms[-1]}) nats; "
            + ("grows with size" if grows else "does not grow with size")
            + ("" if s["require_prior_growth"] else " (smoke: not required)")
        )
        return figures

    def run_arm(self, ctx: Context, arm: str, seed: int) -> Figures:
        s = ctx.settings
        run = self._run(ctx, arm, seed)
        result = train_and_evaluate(run, seed, s["probes"], s["probe_seed"])
        figures = run_figures(result, s["curve_every"])
        size = float(s["sizes"][arm])
        figures["size"] = size
        # the rates' denominator: the overwrite facts (an exact binomial per arm, pooled)
        items = probe_items(s["probes"], s["probe_seed"])
        figures["overwrite_facts"] = sum(i["kind"] == "overwrite" for i in items)
        figures["curves"]["overwritten vs size"] = [[size, figures["overwritten"]]]
        figures["curves"]["drifted vs size"] = [[size, figures["drifted"]]]
        return figures

    def _run(self, ctx: Context, arm: str, seed: int) -> dict[str, Any]:
        """The run dict of ``arm`` for ``seed``: a GPU preset config's, or the CPU / smoke one
        with this seed's training passages written under the preset folder."""
        s = ctx.settings
        if "runs" in s:
            return copy.deepcopy(s["runs"][arm])
        held_out = [i["context"] for i in probe_items(s["probes"], s["probe_seed"])]
        if TRAIN_SEED_OFFSET + seed == s["probe_seed"]:
            raise ValueError(f"seed {seed} would train on the evaluation probes' seed")
        passages = ctx.out / "passages"
        train = train_passages(s["steps"] * s["batch_size"], TRAIN_SEED_OFFSET + seed, held_out)
        train_path = write_passages(passages / f"train_seed{seed}.jsonl", train)
        val_path = write_passages(passages / "eval.jsonl", held_out)
        return cpu_run(s, int(s["sizes"][arm]), train_path, val_path)


def _arm_prior(run: dict[str, Any], items: list[dict[str, Any]]) -> Figures:
    """The compressor's own prior on the facts (as a plain LM, before any training) and the
    time of one training step on a batch of the evaluation passages."""
    import torch

    from lit_rlhf.models.loading import load_tokenizer
    from lit_rlhf.modules import CompressorDecoderModule

    flush_denormals()
    tokenizer = load_tokenizer(run["data"]["tokenizer"])
    module = CompressorDecoderModule(**run["model"], tokenizer=tokenizer)
    module.configure_model()
    assert module.compressor is not None
    if torch.cuda.is_available():
        module.cuda()
    figures = prior_summary(prior_margins(module.compressor.lm, tokenizer, items))
    micro = run["model"].get("optim", {}).get("micro_batch_size", 8)
    texts = [i["context"] for i in items][:micro]
    figures["step_seconds"] = _time_step(module, tokenizer, texts)
    figures["parameters"] = float(sum(p.numel() for p in module.compressor.lm.parameters()))
    return figures


def _time_step(module: Any, tokenizer: Any, texts: list[str]) -> float:
    """Seconds of one forward + backward (the second of two: the first warms up)."""
    from lit_rlhf.data.prompts import pad_ids

    ids, mask = pad_ids(
        tokenizer(texts, add_special_tokens=False)["input_ids"], tokenizer.pad_token_id, "left"
    )
    batch = {"input_ids": ids.to(module.device), "attention_mask": mask.to(module.device)}
    seconds = 0.0
    for _ in range(2):
        start = time.perf_counter()
        out = module.losses(batch)
        (out["ae_sum"] / out["ae_count"]).backward()
        seconds = time.perf_counter() - start
    module.zero_grad(set_to_none=True)
    return seconds


PAPER = CompressionPaper()
