"""ReflectRM (arXiv 2604.07506) at CPU scale: on a warm judge that is above chance but not
saturated and still position-biased, does two-stage reflective inference beat the majority of
the same 8 samples, and does confidence pick the better analysis?

The judge and its warm start are ConsistRM's (:mod:`repro.judge_common`; the warm start mixes
in analysis-preference rows, one per two pairs, so the judge can compare two analyses). Per
seed, ONE set of 8 sampled judgments per held-out row gives majority-of-8 and reflective-of-8
(the seed draws the samples and the reflection order); greedy is one judgment. The arms
``greedy`` / ``majority`` / ``reflective`` read their accuracy from that one set (cached per
seed), so their paired differences compare inference rules, not sample draws. The mechanism
figure: the anchor's accuracy (the most confident sample, by the mean log-prob of its lowest
10 % tokens) against a random sample's (the mean accuracy over the 8).

The unified training arm (``mode: reflectrm`` against RFT from the same warm start) is left
out of the CPU preset: the pre-check's inference alone takes its budget (docs/grm.md).
"""

from __future__ import annotations

import json
from typing import Any

from repro import judge_common as jc
from repro.common import Context, Figures, Paper, Preset, Primary
from repro.consistrm import _settings

INFERENCE_ARMS = ("greedy", "majority", "reflective")


PRESETS: dict[str, Preset] = {
    "cpu": Preset("cpu", (0, 1, 2), 60, _settings()),
    "gpu": Preset("gpu", (0, 1, 2), 60 * 24, {
        "config": "configs/grm/reflectrm_qwen3-4b.yaml",
        "trainer": "configs/trainer/deepspeed_zero3.yaml",
        "rft": "configs/grm/rft_qwen3-8b.yaml"}),
    "smoke": Preset("smoke", (0, 1), 1, _settings(
        model="builtin:tiny-llama", sft_config="configs/sft/tiny.yaml", in_process=True,
        pools={"warm": 4, "unlabelled": 0, "eval": 2}, sft_steps=1, sft_lr=1e-3,
        samples=2, max_new_tokens=6, full_judgments=False)),
}  # fmt: skip


class ReflectRM(Paper):
    name = "reflectrm"
    title = "ReflectRM: reflective vs majority inference of a warm judge (arXiv 2604.07506)"
    doc = "docs/grm.md"
    arms = INFERENCE_ARMS
    primary = Primary("accuracy", "reflective", "majority", +1)
    presets = PRESETS
    table_metrics = ("accuracy", "positional_consistency", "anchor_accuracy",
                     "random_sample_accuracy")  # fmt: skip
    curve_keys = ("random_sample_then_anchor_accuracy",)

    def precheck(self, ctx: Context) -> Figures:
        """The warm judge (cached), then its greedy / majority / reflective figures on the
        held-out pairs for seed 0; go when it is above chance, not saturated (greedy accuracy
        in (0.55, 0.95)) and positionally inconsistent (consistency below accuracy)."""
        if ctx.preset.name == "gpu":
            return {"go": True, "reason": "the authors' recipe (Qwen3-4B)"}
        s = ctx.settings
        pools = jc.make_pools(s["pools"], seed=0, max_value=s["max_value"])
        jc.write_pairs(pools["eval"], ctx.out / "pools" / "eval.jsonl")
        _, sft_seconds = jc.warm_start(ctx.out, pools["warm"], s, log=ctx.log)
        figures: Figures = {**self._inference(ctx, 0), "sft_seconds": sft_seconds}
        acc, cons = figures["greedy_accuracy"], figures["greedy_consistency"]
        figures["go"] = ctx.preset.name == "smoke" or (0.55 < acc < 0.95 and cons < acc)
        figures["reason"] = (
            f"warm judge greedy accuracy {acc:.3f}, positional consistency {cons:.3f}, "
            f"says response 1 {figures['greedy_first_rate']:.2f} of the time"
        )
        return figures

    def _inference(self, ctx: Context, seed: int) -> Figures:
        """Every inference figure of the warm judge for ``seed`` (one set of samples), cached
        in ``<out>/inference-seed<k>.json`` so the three arms share it."""
        path = ctx.out / f"inference-seed{seed}.json"
        if path.exists():
            cached: Figures = json.loads(path.read_text())
            return cached
        s = ctx.settings
        judged = jc.judge_pool(
            jc.warm_judge(ctx.out, s), ctx.out / "pools" / "eval.jsonl", samples=s["samples"],
            seed=seed, max_new_tokens=s["max_new_tokens"], batch_size=s["eval_batch_size"],
        )  # fmt: skip
        figures = jc.inference_figures(judged)
        path.write_text(json.dumps(figures, indent=1))
        return figures

    def run_arm(self, ctx: Context, arm: str, seed: int) -> Figures:
        if ctx.preset.name == "gpu":
            raise SystemExit("the gpu preset runs the authors' recipe: see docs/grm.md")
        figures = self._inference(ctx, seed)
        keep: dict[str, Any] = {k: v for k, v in figures.items() if not k.startswith(arm)}
        # the mechanism panel: a random sample's accuracy (x = 0) against the anchor's (x = 1)
        anchor = [[0.0, figures["random_sample_accuracy"]], [1.0, figures["anchor_accuracy"]]]
        return {
            **keep,
            "accuracy": figures[f"{arm}_accuracy"],
            "positional_consistency": figures[f"{arm}_consistency"],
            "curves": {"random_sample_then_anchor_accuracy": anchor},
        }


PAPER = ReflectRM()
