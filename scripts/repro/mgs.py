"""MGS (Modular Gradient Surgery, arXiv 2602.02301): are the domains' gradient conflicts more
frequent per module than over the whole gradient, beyond what random domain labels give?

    python scripts/reproduce.py mgs --preset cpu      # pre-check + 4 arms x 3 seeds
    python scripts/reproduce.py mgs --precheck-only   # the variance filter alone
    python scripts/reproduce.py mgs --smoke           # tiny random models, plumbing only

Three live domains for the embedded SmolLM2-135M-Instruct (configs/ppo/multidomain_smollm2.yaml):
Countdown, verifiable instructions from the offline generator, chat scored by MiniLM similarity
to reference answers. Pre-check: the base policy samples each candidate prompt's group; prompts
whose group rewards all tie (no GRPO signal) are dropped and the rest written to
``<out>/mgs/<preset>/prompts/<domain>.jsonl``, which the arms train on; go when every domain
keeps ``min_pool`` prompts. Arms (``ModularGradientSurgery`` in each, measuring per-module and
global conflicts on the same per-domain gradients every step): ``mixed`` (measure only: the step
is the plain sum), ``null`` (the mixed run with the domain labels permuted across the step's
prompts before the per-domain split: the conflicts random labels give; same batches, same
training), ``pcgrad`` (PCGrad on the flattened gradient) and ``mgs`` (PCGrad per attention / MLP
module). Primary: ``conflict_gap`` = mean over steps of (per-module - global conflict
fraction), mixed minus null, expected > 0 (docs/history/multidomain.md).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import ClassVar

from repro.common import Context, Figures, Paper, Preset, Primary
from repro.intervals import Kind, bounded
from repro.mgs_runs import (
    arm_fragment,
    candidate_rows,
    filter_figures,
    load_config,
    run_figures,
    run_fit,
    sample_and_score,
    write_pool,
)

CPU_CONFIG = "configs/ppo/multidomain_smollm2.yaml"
_TINY = "builtin:tiny-llama"

PRESETS = {
    "cpu": Preset("cpu", (0, 1, 2), 60.0, {
        "configs": [CPU_CONFIG],
        # measured with 36 / 36 / 24: 5, 7, 24 kept (docs/history/multidomain.md): larger pools
        "pools": {"countdown": 72, "ifeval": 48, "chat": 24},
        "min_pool": 8, "variance_floor": 1e-6, "precheck_batch": 12,
        "steps": 8, "batch_size": 6,
    }),
    "gpu": Preset("gpu", (0, 1, 2), 4 * 24 * 60.0, {
        # the authors' recipe (Qwen2.5-7B, every setting in docs/recipes.md) under ZeRO-2; the
        # MGS arm keeps their per-tensor groups; every arm measures module and global conflicts
        "configs": ["configs/ppo/multidomain_mgs_qwen2.5-7b.yaml",
                    "configs/trainer/deepspeed_zero2.yaml"],
        "pools": {"math": 512, "chat": 512, "ifeval": 512},
        "min_pool": 128, "variance_floor": 1e-6, "precheck_batch": 64,
        "steps": None, "batch_size": 8, "tensor_granularity": True,
        "other_callbacks": [{"class_path": "lit_rlhf.callbacks.EntropyBonus",
                             "init_args": {"alpha": 0.001}}],
    }),
    "smoke": Preset("smoke", (0, 1), 1.0, {
        "configs": [CPU_CONFIG],
        "pools": {"countdown": 3, "ifeval": 3, "chat": 3},
        # a random tiny model's rewards tie: keep every prompt (plumbing only)
        "min_pool": 1, "variance_floor": -1.0, "precheck_batch": 9,
        "steps": 2, "batch_size": 3,
        "overrides": {
            "trainer": {"precision": "32-true"},
            "model": {"init_args": {
                "model": _TINY,
                "engine": {"init_args": {"max_new_tokens": 6}},
                "reward": {"init_args": {"rewards": {"chat": {
                    "class_path": "lit_rlhf.rewards.ReferenceSimilarityReward",
                    "init_args": {"embedder": _TINY}}}}},
            }},
            "data": {"init_args": {"tokenizer": _TINY}},
        },
    }),
}  # fmt: skip


class MGS(Paper):
    name = "mgs"
    title = "MGS: per-module vs global gradient conflicts across three domains (arXiv 2602.02301)"
    doc = "docs/multidomain.md"
    arms = ("mixed", "null", "pcgrad", "mgs")
    primary = Primary("conflict_gap", treatment="mixed", baseline="null", direction=1)
    presets = PRESETS
    # a difference of two conflict fractions lives in [-1, 1]; a collapsed run counts as -1,
    # the worst for the paper's direction (per-module conflict above global); the fractions and
    # the removed share in [0, 1]
    metric_kinds: ClassVar[dict[str, Kind]] = {
        "conflict_gap": bounded(-1.0, 1.0),
        **{m: bounded(0.0, 1.0) for m in ("module_conflict", "global_conflict", "removed_share")},
    }
    table_metrics = (
        "conflict_gap", "module_conflict", "global_conflict", "module_cosine", "global_cosine",
        "module_removed", "global_removed", "removed_share", "undefined_pairs",
        "reward_countdown", "reward_ifeval", "reward_chat",
    )  # fmt: skip
    curve_keys = (
        "conflict_gap", "module_conflict", "global_conflict", "module_cosine", "global_cosine",
        "module_removed", "global_removed",
    )  # fmt: skip

    def precheck(self, ctx: Context) -> Figures:
        """Per domain, the share of candidate prompts whose group has a non-zero reward
        variance under the base policy; the kept prompts are written for the arms."""
        s = ctx.settings
        config = load_config(s)
        candidates = candidate_rows(config, s["pools"])
        rows = [r for task in sorted(candidates) for r in candidates[task]]
        ctx.log(f"pre-check: sampling {len(rows)} prompts x their group")
        scores = sample_and_score(config, rows, s["precheck_batch"])
        by_task: dict[str, list[list[float]]] = {}
        for row, group in zip(rows, scores, strict=True):
            by_task.setdefault(str(row["task"]), []).append(group)
        figures = filter_figures(by_task, min_pool=s["min_pool"], floor=s["variance_floor"])
        pools: dict[str, str] = {}
        for task, task_rows in candidates.items():
            kept = [r for r, g in zip(task_rows, by_task[task], strict=True)
                    if statistics.pstdev(g) > s["variance_floor"]]  # fmt: skip
            path = write_pool(ctx.out / "prompts" / f"{task}.jsonl", kept)
            pools[task] = str(path)
        figures["pools"] = pools
        return figures

    def run_arm(self, ctx: Context, arm: str, seed: int) -> Figures:
        pools = self._pools(ctx)
        root = ctx.run_dir(arm, seed)
        fragment = arm_fragment(ctx.settings, arm, seed, root, pools)
        metrics = run_fit(fragment, root / "config.yaml")
        return run_figures(metrics, sorted(pools))

    @staticmethod
    def _pools(ctx: Context) -> dict[str, str]:
        precheck = json.loads((ctx.out / "precheck.json").read_text())["figures"]
        pools: dict[str, str] = precheck["pools"]
        empty = [t for t, p in pools.items() if not Path(p).read_text().strip()]
        if empty:
            raise SystemExit(f"the pre-check kept no prompt of {empty}: nothing to train on")
        return pools


PAPER = MGS()
