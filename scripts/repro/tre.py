"""TRE (Trust Region Entropy, arXiv 2602.03635): does a global entropy bonus move probability mass
into the vocabulary's tail where the trust-region bonus does not?

    python scripts/reproduce.py tre --preset cpu      # pre-check + 3 arms x 3 seeds
    python scripts/reproduce.py tre --precheck-only   # the difficulty search alone
    python scripts/reproduce.py tre --smoke           # tiny random model, plumbing only

Pre-check: the base policy's held-out greedy pass@1 (and pass@k of k samples) on Countdown at
difficulties from easy to hard, through ``lit-rlhf validate``; the first whose pass@1 lies in
[0.05, 0.5] is trained on (go), none: no go (the reward would be all 0 or nearly all 1, and the
group advantages mostly 0). Arms: vanilla PPO (GRPO advantages), a full-vocabulary entropy bonus
and TRE-K (K = 2), at one alpha (the authors' 0.001 on the GPU preset, 0.01 on the CPU preset:
see below). TRE-P is left out: a fourth arm does not fit the CPU preset's hour. Every arm also runs
``TrustRegionDiagnostics`` (no loss): per rollout step the mass outside the top-2 set / the 0.99
nucleus and the entropy inside each. Primary: the top-2 tail mass at the end of training,
entropy bonus minus TRE-K, expected > 0 (docs/exploration.md).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from repro.common import Context, Figures, Paper, Preset, Primary
from repro.intervals import Kind, bounded
from repro.tre_runs import (
    arm_fragment,
    curve_figures,
    eval_figures,
    eval_fragment,
    nearest_difficulty,
    pick_difficulty,
    run_cli,
)

CALLBACKS = "lit_rlhf.callbacks"
ALPHA = 0.001  # the authors' weight for the entropy bonus and TRE (METHODS.md sec. 1)
# The CPU preset's deviation (docs/history/exploration.md): on one batch of 16 SmolLM2 Countdown
# samples the bonus gradient is 0.4 % (entropy) / 0.6 % (TRE-K) of the policy gradient's norm at
# 0.001; 0.01 over 40 rollout steps gives alpha x steps = 0.40, the authors' 0.001 x 406 steps =
# 0.41.
CPU_ALPHA = 0.01


def arm_callbacks(alpha: float) -> dict[str, dict[str, Any] | None]:
    """Each arm's exploration callback (vanilla: none)."""
    tre = f"{CALLBACKS}.TrustRegionEntropy"
    return {
        "vanilla": None,
        "entropy": {"class_path": f"{CALLBACKS}.EntropyBonus", "init_args": {"alpha": alpha}},
        "tre-k": {"class_path": tre, "init_args": {"alpha": alpha, "mode": "topk", "k": 2}},
    }


def _template(count: str, example: str, answer: str) -> str:
    """Countdown with + only. Naming the count and asking to close the tag matters at 135M: with
    the demo's wording SmolLM2 often writes ``3 + 4 = 7`` and no ``</answer>`` (pass@1 0.00 on
    2 numbers; 0.28 with this one, 32 held-out tasks, greedy)."""
    return (
        f"Combine the {count} numbers with +, using each exactly once, to reach the target. "
        f"Write only the expression and close the tag. Example: {example} give "
        f"<answer>{answer}</answer>. Now: numbers {{numbers}} and target {{target}}."
    )


_TWO = _template("two", "numbers 3, 4 and target 7", "3 + 4")
_THREE = _template("three", "numbers 3, 4, 5 and target 12", "3 + 4 + 5")
# From hard to easy: the first in range is the hardest task the base policy still solves
# sometimes (the demo's task, 2 numbers 1-10, is last).
CPU_DIFFICULTIES: list[dict[str, Any]] = [
    {"name": "3 numbers 1-10, +", "num_numbers": 3, "max_value": 10, "max_target": 30,
     "operators": "+", "question_template": _THREE},
    {"name": "2 numbers 1-20, +", "num_numbers": 2, "max_value": 20, "max_target": 40,
     "operators": "+", "question_template": _TWO},
    {"name": "2 numbers 1-10, +", "num_numbers": 2, "max_value": 10, "max_target": 20,
     "operators": "+", "question_template": _TWO},
]  # fmt: skip
# The paper's task (the config's own wording, with <think>): 3-4 numbers, + - * /.
PAPER_DIFFICULTY = {"name": "paper: 3-4 numbers 1-99, + - * /", "num_numbers": [3, 4],
                    "max_value": 99, "max_target": 999, "operators": "+-*/"}  # fmt: skip

_COMMON = {"k": 4, "k_region": 2, "p_region": 0.99, "alpha": ALPHA, "pass_range": [0.05, 0.5]}

PRESETS = {
    "cpu": Preset("cpu", (0, 1, 2), 60.0, {
        **_COMMON,
        "configs": ["configs/ppo/countdown_smollm2.yaml"],
        "difficulties": CPU_DIFFICULTIES,
        "alpha": CPU_ALPHA,
        "steps": 40, "batch_size": 4, "eval_prompts": 64, "val_batch_size": 64,
        # two optimizer steps per rollout (mini-batches of 8 of the 16 samples)
        "model": {"update": {"mini_batch_size": 8}},
    }),
    "gpu": Preset("gpu", (0, 1, 2), 24 * 60.0, {
        **_COMMON,
        "k": 8,  # the authors' samples per prompt
        "configs": ["configs/ppo/countdown_tre.yaml", "configs/trainer/deepspeed_zero2.yaml"],
        "difficulties": [PAPER_DIFFICULTY],
        "steps": None, "batch_size": 512, "eval_prompts": 512, "val_batch_size": 512,
        # DeepSpeed clips the joint norm of policy and critic (docs/scaling.md)
        "model": {"optim": {"clip_per_network": False}},
    }),
    "smoke": Preset("smoke", (0, 1), 1.0, {
        **_COMMON,
        "configs": ["configs/ppo/countdown_tiny.yaml"],
        "difficulties": CPU_DIFFICULTIES[-1:],
        "pass_range": [0.0, 1.0],  # a random tiny model passes nothing: plumbing only
        "steps": 2, "batch_size": 2, "eval_prompts": 4, "val_batch_size": 4,
        "model": {"update": {"mini_batch_size": 4}, "optim": {"micro_batch_size": 4},
                  "engine": {"init_args": {"max_new_tokens": 8}}},
    }),
}  # fmt: skip


class TRE(Paper):
    name = "tre"
    title = "TRE: tail mass under a global vs a trust-region entropy bonus (arXiv 2602.03635)"
    doc = "docs/exploration.md"
    arms = ("vanilla", "entropy", "tre-k")
    primary = Primary("tail_mass_topk", treatment="entropy", baseline="tre-k", direction=1)
    presets = PRESETS
    table_metrics = (
        "tail_mass_topk", "tail_mass_topk_change", "tail_mass_topp", "entropy_topk",
        "entropy_topp", "entropy_full", "reward", "pass@1", "pass@k", "sampled_pass@1",
    )  # fmt: skip
    curve_keys = ("tail_mass_topk", "tail_mass_topp", "entropy_topk", "entropy_full", "reward")
    # masses and pass rates live in [0, 1]: percentile bootstrap over seeds. A collapsed run
    # counts as the worst value (repro.intervals): all mass in the tail, nothing passed
    metric_kinds: ClassVar[dict[str, Kind]] = {
        "tail_mass_topk": bounded(0.0, 1.0, worst=1.0),
        "tail_mass_topp": bounded(0.0, 1.0, worst=1.0),
        **{m: bounded(0.0, 1.0) for m in ("pass@1", "pass@k", "sampled_pass@1")},
    }

    def precheck(self, ctx: Context) -> Figures:
        """Greedy pass@1 and pass@k of the base policy per difficulty, easy to hard, stopping
        at the first in ``pass_range``."""
        s = ctx.settings
        low, high = s["pass_range"]
        tried: list[dict[str, Any]] = []
        for i, difficulty in enumerate(s["difficulties"]):
            root = ctx.out / "precheck" / f"difficulty{i}"
            metrics = run_cli(
                "validate", s["configs"], eval_fragment(s, difficulty, root), root / "fragment.yaml"
            )
            tried.append({**difficulty, **eval_figures(metrics, s["k"])})
            ctx.log(f"pre-check {difficulty['name']}: greedy pass@1 {tried[-1]['pass@1']:.3f}")
            if pick_difficulty(tried, low, high) is not None:
                break
        chosen = pick_difficulty(tried, low, high)
        index = None if chosen is None else tried.index(chosen)
        pass1 = ", ".join(f"{d['name']}: {d['pass@1']:.3f}" for d in tried)
        reason = (
            f"greedy pass@1 in [{low}, {high}] at '{chosen['name']}' ({pass1})"
            if chosen
            else f"no difficulty with greedy pass@1 in [{low}, {high}] ({pass1})"
        )
        name = None if chosen is None else chosen["name"]
        go = chosen is not None
        return {"go": go, "reason": reason, "tried": tried, "k": s["k"], "chosen": name,
                "chosen_index": index}  # fmt: skip

    def run_arm(self, ctx: Context, arm: str, seed: int) -> Figures:
        s = ctx.settings
        difficulty = self._difficulty(ctx)
        root = ctx.run_dir(arm, seed)
        callback = arm_callbacks(s["alpha"])[arm]
        fragment = arm_fragment(s, difficulty, root, seed, callback)
        metrics = run_cli("fit", s["configs"], fragment, root / "fragment.yaml")
        figures = {**eval_figures(metrics, s["k"]), **curve_figures(root / "logs" / "metrics.csv")}
        figures["difficulty"] = difficulty["name"]
        return figures

    @staticmethod
    def _difficulty(ctx: Context) -> dict[str, Any]:
        """The pre-check's choice (under ``--force`` without one: the nearest to the range)."""
        precheck = json.loads((ctx.out / "precheck.json").read_text())["figures"]
        index = precheck["chosen_index"]
        if index is None:
            nearest = nearest_difficulty(precheck["tried"], *ctx.settings["pass_range"])
            index = precheck["tried"].index(nearest)
        difficulty: dict[str, Any] = ctx.settings["difficulties"][index]
        return difficulty


PAPER = TRE()
