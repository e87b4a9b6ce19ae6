"""The settings of a PPO-family update, as one typed, frozen, validated record.

Modules keep flat constructor arguments (that is what LightningCLI and YAML see) and build a
:class:`PPOSettings` from them in ``__init__``, so a bad value fails when the module is built,
before any model loads, with a message that names the setting and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

Advantage = Literal["gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
PolicyLoss = Literal["ppo", "gspo"]
MismatchCorrection = Literal["auto", "none", "tis", "mask"]
CriticKind = Literal["separate", "value_head"]
LossAggregation = Literal[
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"
]
Estimator = Literal["k1", "k2", "k3"]
KLPlacement = Literal["loss", "reward"]


@dataclass(frozen=True)
class PPOSettings:
    """What the advantage estimation and the clipped update read (see ``PPOModule`` for the
    meaning of each field; the defaults are PPOModule's)."""

    advantage: Advantage = "grpo"
    samples_per_prompt: int = 4
    scale_by_std: bool = True
    whiten_advantages: bool = True
    gamma: float = 1.0
    lam: float = 1.0
    critic: CriticKind = "separate"
    ppo_epochs: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int = 8
    micro_batch_tokens: int | None = None
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    value_clip: float | None = 0.2
    vf_coef: float = 0.5
    loss_agg: LossAggregation = "token_mean"
    kl_estimator: Estimator = "k3"
    kl_in: KLPlacement = "loss"
    recompute_old_log_probs: bool = False
    policy_loss: PolicyLoss = "ppo"
    advantage_eps: float = 1e-6
    loss_norm_length: int | None = None
    kl_ratio_correction: bool = False
    mismatch_correction: MismatchCorrection = "auto"
    mismatch_cap: float = 2.0
    mismatch_low: float = 0.5
    mismatch_high: float = 2.0
    overlong_filter: bool = False
    overlong_buffer: int | None = None
    overlong_penalty_factor: float = 1.0
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 10
    max_staleness: int = 0

    def __post_init__(self) -> None:
        self._check_literals()
        self._check_ranges()

    def _check_literals(self) -> None:
        hints = get_type_hints(type(self))
        for spec in dataclasses.fields(self):
            allowed = get_args(hints[spec.name])
            if get_origin(hints[spec.name]) is Literal and getattr(self, spec.name) not in allowed:
                raise ValueError(
                    f"{spec.name}={getattr(self, spec.name)!r} is not one of {list(allowed)}"
                )

    def _check_ranges(self) -> None:
        rules = [
            ("samples_per_prompt", self.samples_per_prompt >= 1, ">= 1"),
            ("ppo_epochs", self.ppo_epochs >= 1, ">= 1"),
            ("micro_batch_size", self.micro_batch_size >= 1, ">= 1"),
            ("micro_batch_tokens", self.micro_batch_tokens is None or self.micro_batch_tokens >= 1,
             ">= 1 token (prompt + response tokens per packed micro-batch), or null (padded "
             "micro-batches of micro_batch_size sequences)"),
            ("mini_batch_size", self.mini_batch_size is None or self.mini_batch_size >= 1,
             ">= 1, or null for the whole rollout"),
            ("clip_low", 0 < self.clip_low < 1, "in (0, 1): the ratio's lower bound 1 - clip_low"),
            ("clip_high", self.clip_high > 0, "> 0"),
            ("dual_clip", self.dual_clip is None or self.dual_clip > 1,
             "> 1 (it caps the loss of negative advantages at dual_clip x |A|), or null"),
            ("value_clip", self.value_clip is None or self.value_clip > 0, "> 0, or null"),
            ("vf_coef", self.vf_coef >= 0, ">= 0"),
            ("gamma", 0 <= self.gamma <= 1, "in [0, 1]"),
            ("lam", 0 <= self.lam <= 1, "in [0, 1]"),
            ("advantage_eps", 0 <= self.advantage_eps < math.inf, ">= 0 and finite"),
            ("loss_norm_length", self.loss_norm_length is None or self.loss_norm_length >= 1,
             ">= 1 (the constant of seq_mean_token_sum_norm), or null for max_new_tokens"),
            ("mismatch_cap", 1 <= self.mismatch_cap < math.inf,
             ">= 1 and finite (a cap below 1 would shrink every on-policy token's weight)"),
            ("mismatch_low", 0 <= self.mismatch_low < 1, "in [0, 1)"),
            ("mismatch_high", 1 < self.mismatch_high < math.inf, "> 1 and finite"),
            ("overlong_buffer", self.overlong_buffer is None or self.overlong_buffer >= 1,
             ">= 1 token, or null (no soft overlong penalty)"),
            ("overlong_penalty_factor", 0 <= self.overlong_penalty_factor < math.inf,
             ">= 0 and finite"),
            ("dynamic_sampling_max_rounds", self.dynamic_sampling_max_rounds >= 1,
             ">= 1 (prompt batches drawn in a row for one update)"),
            ("max_staleness", self.max_staleness >= 0,
             ">= 0 (0: on-policy; k: each update trains on a batch sampled k updates before)"),
        ]  # fmt: skip
        for name, ok, wanted in rules:
            if not ok:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} must be {wanted}. Fix: set {name} in that "
                    "range."
                )
        self._check_combinations()

    def _check_combinations(self) -> None:
        if self.policy_loss == "gspo" and self.loss_agg != "seq_mean_token_mean":
            raise ValueError(
                f"policy_loss='gspo' optimises one ratio per sequence, averaged over sequences "
                f"(arXiv 2507.18071 eq. 5), but loss_agg={self.loss_agg!r} weighs sequences by "
                "their length. Fix: set loss_agg: seq_mean_token_mean."
            )
        if self.mismatch_correction in ("tis", "mask") and not self.trainer_old_log_probs:
            raise ValueError(
                f"mismatch_correction={self.mismatch_correction!r} compares the engine's "
                "log-probs with the trainer's, but with several updates per rollout the "
                "trainer's old log-probs are not computed. Fix: set recompute_old_log_probs: "
                "true (or one update per rollout: ppo_epochs 1, mini_batch_size null)."
            )
        self._check_staleness()
        if self.dynamic_sampling and self.samples_per_prompt < 2:
            raise ValueError(
                "dynamic_sampling keeps groups whose rewards differ, and a group of "
                "samples_per_prompt=1 never differs. Fix: samples_per_prompt >= 2."
            )
        single = self.advantage in ("gae", "reinforce_pp")
        if not single and self.samples_per_prompt < 2:
            raise ValueError(
                f"advantage={self.advantage!r} compares samples of the same prompt: set "
                "samples_per_prompt >= 2, or use advantage='gae' with a critic"
            )

    def _check_staleness(self) -> None:
        if self.max_staleness == 0:
            return
        problem = fix = ""
        if not self.trainer_old_log_probs:
            problem = (
                "clips against the proximal policy (the weights before the update), whose "
                "log-probs the trainer computes only with one update per rollout or "
                "recompute_old_log_probs"
            )
            fix = "set recompute_old_log_probs: true (or ppo_epochs 1, mini_batch_size null)"
        elif self.mismatch_correction == "none":
            problem = (
                "samples from older weights, and mismatch_correction='none' would drop the "
                "importance weight pi_prox / mu that corrects for them (the update would be "
                "silently off-policy)"
            )
            fix = "set mismatch_correction: tis (or auto, or mask)"
        elif self.dynamic_sampling:
            problem = "does not combine with dynamic_sampling yet"
            fix = "set dynamic_sampling: false, or max_staleness: 0"
        if problem:
            raise ValueError(
                f"max_staleness={self.max_staleness} (decoupled PPO, arXiv 2505.24298) "
                f"{problem}. Fix: {fix}."
            )

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> PPOSettings:
        """The settings named in ``hparams`` (a module's hyperparameters); the rest default."""
        return cls(
            **{f.name: hparams[f.name] for f in dataclasses.fields(cls) if f.name in hparams}
        )

    def check_rollout_size(self, prompts_per_batch: int) -> None:
        """Refuse a ``mini_batch_size`` that does not divide the rollout of one batch of
        ``prompts_per_batch`` prompts (each epoch would end with a smaller optimizer step)."""
        n, size = prompts_per_batch * self.samples_per_prompt, self.mini_batch_size
        if size is None or n % size == 0:
            return
        divisors = [d for d in range(1, n + 1) if n % d == 0 and d < n]
        raise ValueError(
            f"mini_batch_size={size} does not divide the rollout of {prompts_per_batch} prompts "
            f"x samples_per_prompt={self.samples_per_prompt} = {n} sequences: every PPO epoch "
            f"would end with a step on {n % size if size < n else n}. Fix: set mini_batch_size "
            f"to a divisor of {n} (e.g. {divisors[-1] if divisors else n}), or null for one "
            "step per rollout, or change data.init_args.batch_size."
        )

    @property
    def trainer_old_log_probs(self) -> bool:
        """Whether the update's old log-probs come from the trainer's own forward (recomputed,
        or the current policy's when every rollout gets exactly one update)."""
        one_update = self.ppo_epochs == 1 and self.mini_batch_size is None
        return self.recompute_old_log_probs or one_update

    def update_size(self, n: int) -> int:
        """Sequences per optimizer step for a rollout of ``n`` sequences."""
        return self.mini_batch_size or n

    def single_update(self, n: int) -> bool:
        """Whether a rollout of ``n`` sequences gets exactly one optimizer step: the rollout
        policy *is* the current policy then, so its log-probs are the current ones, detached
        (exact ratio 1, no extra forward pass)."""
        return (
            self.ppo_epochs == 1 and self.update_size(n) >= n and not self.recompute_old_log_probs
        )


def module_setting_rules(hparams: Mapping[str, Any]) -> list[tuple[str, bool, str]]:
    """(name, ok, wanted) for the optimisation settings the RL modules share (those present)."""
    rules = {
        "lr": ("> 0 and finite (a negative lr would ascend the loss)", _positive),
        "critic_lr": ("> 0 and finite", _positive),
        "weight_decay": (">= 0 and finite", lambda v: 0 <= v < math.inf),
        "margin": (">= 0 and finite (0: plain Bradley-Terry)", lambda v: 0 <= v < math.inf),
        "seed": (">= 0", lambda v: v >= 0),
        "kl_coef": (
            ">= 0 (0 = no KL term and no reference model; a negative coefficient would reward "
            "drifting away from the reference)",
            lambda v: 0 <= v < math.inf,
        ),
    }
    found = [(k, check(hparams[k]), wanted) for k, (wanted, check) in rules.items() if k in hparams]
    return [*found, *lora_setting_rules(hparams)]


def lora_setting_rules(hparams: Mapping[str, Any]) -> list[tuple[str, bool, str]]:
    """(name, ok, wanted) for the LoRA settings (``lora_rank``, ``lora_alpha``,
    ``lora_dropout``) of a module that has them; none otherwise."""
    if "lora_rank" not in hparams:
        return []
    rank = hparams["lora_rank"]
    # under LoRA the reference is the trained network with its adapters off, not a copy
    copy_of_reference = hparams.get("reference_model") is not None
    return [
        ("lora_rank", rank >= 0, ">= 0 (0: no LoRA)"),
        ("lora_alpha", rank == 0 or hparams["lora_alpha"] > 0, "> 0 with lora_rank > 0"),
        ("lora_dropout", 0 <= hparams.get("lora_dropout", 0.0) < 1, "in [0, 1)"),
        (
            "reference_dtype",
            rank == 0 or copy_of_reference or hparams.get("reference_dtype") is None,
            "null with lora_rank > 0 (the reference is the trained network with its adapters "
            "off, in dtype, so reference_dtype would change nothing; a separate "
            "reference_model, where the module has one, may take it)",
        ),
    ]


def refuse_out_of_range(rules: Sequence[tuple[str, bool, str]], values: Mapping[str, Any]) -> None:
    """Raise for the first rule that fails, naming the setting, its value and the range."""
    for name, ok, wanted in rules:
        if not ok:
            raise ValueError(
                f"{name}={values[name]!r} must be {wanted}. Fix: set model.init_args.{name} in "
                "that range."
            )


def _positive(value: float) -> bool:
    return 0 < value < math.inf
