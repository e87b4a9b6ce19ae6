"""Both sides of a parity case on one fixed rollout: TRL 1.16's ``GRPOTrainer`` (its own
``_generate_and_score_completions`` and ``compute_loss``) and lit-rlhf's ``PolicyStep`` /
``PPOUpdate`` (its own rollout, experience and micro-batch losses), each on its own copy of the
same tiny random model.

The rollout is scripted, not sampled: 2 prompts (one left-padded) x 4 responses of
``builtin:tiny-llama``, some ended by EOS (one of them exactly at the cap), some cut at
``MAX_NEW`` tokens. The engine's log-probs are the trainer's under the old weights shifted by
fixed per-token offsets, so the ratio ``pi_old / mu`` falls inside and outside any band in
[0.2, 4]. Three weight sets: ``ref`` (the reference, the model as loaded), ``old`` (the weights
that generated) and ``cur`` (the weights being updated, one optimizer step later), so ratios
``pi / pi_old`` leave the clip and the KL to the reference is not zero. TRL is fed through
``rollout_func`` (prompt ids, completion ids and the engine's ``logprobs``), as its docs describe
for a custom engine; its IS correction, which it applies only with vLLM, takes the
``vllm_importance_sampling_*`` fields from ``GRPOConfig`` and ``use_vllm = True`` set on the
built trainer (there is no vLLM behind it).

TRL is imported inside the functions: the default venv has none, and collecting this folder
there must not fail (the tests are deselected by their ``vllm`` marker).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field
from functools import cache
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.models.forward import forward_response
from lit_rlhf.settings import (
    AdvantageSettings,
    KLSettings,
    MismatchSettings,
    OptimSettings,
    PolicyLossSettings,
    RolloutSettings,
    UpdateSettings,
)
from lit_rlhf.training.policy_step import PolicyStep
from lit_rlhf.training.ppo_update import PPOUpdate
from lit_rlhf.training.rollouts import RolloutCollector
from lit_rlhf.training.settings import PPOSettings
from lit_rlhf.types import GenerationOutput

G = 4  # responses per prompt
MAX_NEW = 6  # the engine's max_new_tokens = TRL's max_completion_length
PROMPTS = [[17, 42, 99, 7], [250, 3]]  # the second is left-padded in both libraries
# per row: (response length, ends with EOS). Length MAX_NEW without EOS = truncated.
SHAPES = [(6, False), (3, True), (5, True), (6, False), (4, True), (6, True), (2, True), (6, False)]
# rewards per row; the second group is nearly flat, so the std epsilon matters there
REWARDS = [1.0, 0.0, 0.5, 2.0, 0.3, 0.3015, 0.3, 0.3007]
TOL = 2e-5  # relative, on the loss and on the largest gradient entry


@dataclass(frozen=True)
class Weights:
    ref: dict[str, Tensor]
    old: dict[str, Tensor]
    cur: dict[str, Tensor]


@dataclass
class Scenario:
    model_dir: str
    tokenizer: Any
    weights: Weights
    prompt_ids: Tensor  # [B, P] left-padded with the pad id
    prompt_mask: Tensor  # [B, P] bool
    response_ids: Tensor  # [B, R] right-padded with the pad id
    response_mask: Tensor  # [B, R] bool
    log_offsets: Tensor  # [B, R] log(pi_old / mu) given to the engine
    score_of: dict[str, float] = field(default_factory=dict)  # decoded response -> reward

    @property
    def batch_size(self) -> int:
        return int(self.response_ids.shape[0])


@cache
def _loaded(model_dir: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def load_model(model_dir: str, state: dict[str, Tensor]) -> nn.Module:
    """A fresh copy of the model (loaded once per process) holding ``state``, in train mode."""
    model = copy.deepcopy(_loaded(model_dir))
    model.load_state_dict(state)
    return model.train()


def _perturbed(state: dict[str, Tensor], scale: float, seed: int) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        k: v + scale * v.std().clamp(min=1e-3) * torch.randn(v.shape, generator=gen)
        if v.is_floating_point() and v.numel() > 1
        else v.clone()
        for k, v in state.items()
    }


@cache
def scenario() -> Scenario:
    """The fixed rollout, weights and rewards every case uses (built once per process)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlhf.models import resolve

    model_dir = resolve("builtin:tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    ref = {k: v.clone() for k, v in ref.items()}
    old = _perturbed(ref, 0.3, seed=1)
    weights = Weights(ref=ref, old=old, cur=_perturbed(old, 0.8, seed=2))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    gen = torch.Generator().manual_seed(3)
    rows, masks = [], []
    for length, ends in SHAPES:
        ids = torch.randint(2, 500, (MAX_NEW,), generator=gen)
        if ends:
            ids[length - 1] = eos
        ids[length:] = pad
        rows.append(ids)
        masks.append(torch.arange(MAX_NEW) < length)
    response_ids, response_mask = torch.stack(rows), torch.stack(masks)
    offsets = torch.empty(response_ids.shape).uniform_(-1.5, 1.4, generator=gen)
    prompt_ids, prompt_mask = _left_padded(PROMPTS, pad)
    prompt_ids = prompt_ids.repeat_interleave(G, dim=0)
    prompt_mask = prompt_mask.repeat_interleave(G, dim=0)
    texts = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
    assert len(set(texts)) == len(texts), "decoded responses must differ (they key the rewards)"
    return Scenario(
        model_dir, tokenizer, weights, prompt_ids, prompt_mask, response_ids, response_mask,
        offsets * response_mask, dict(zip(texts, REWARDS, strict=True)),
    )  # fmt: skip


def _left_padded(prompts: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    return ids, mask


def scripted_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """A TRL-style reward (both libraries call it): the fixed score of each decoded response."""
    table = scenario().score_of
    return [table[text] for text in completions]


@cache
@torch.no_grad()
def engine_log_probs(temperature: float) -> Tensor:
    """[B, R] the engine's log-probs: the old weights' (tempered) log-probs minus the offsets."""
    sc = scenario()
    model = load_model(sc.model_dir, sc.weights.old)
    ids = torch.cat([sc.prompt_ids, sc.response_ids], dim=1)
    attn = torch.cat([sc.prompt_mask, sc.response_mask], dim=1)
    fwd = forward_response(model, ids, attn, sc.response_ids, temperature=temperature)
    return (fwd.log_probs - sc.log_offsets).masked_fill(~sc.response_mask, 0.0)


class ScriptedEngine:
    """A generation engine that returns the scenario's responses and engine log-probs."""

    separate_numerics = True  # its log-probs are not the trainer's (as vLLM's)

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.max_new_tokens = MAX_NEW

    def generate(self, model: Any, input_ids: Tensor, attention_mask: Tensor, tokenizer: Any,
                 *, greedy: bool = False, log_probs: bool = True,
                 max_new_tokens: int | None = None) -> GenerationOutput:  # fmt: skip
        sc = scenario()
        same = torch.equal(input_ids, sc.prompt_ids)
        assert same and torch.equal(attention_mask.bool(), sc.prompt_mask), "other prompt rows"
        lp = engine_log_probs(self.temperature) if log_probs else None
        return GenerationOutput(sc.response_ids.clone(), sc.response_mask.clone(), lp)

    def sync_weights(self, model: Any) -> None:
        pass


# ---------------------------------------------------------------------------------- lit-rlhf


def lit_settings(**dotted: Any) -> PPOSettings:
    """The base settings of every case (TRL's defaults where lit-rlhf's differ: the std
    epsilon 1e-4; two updates per rollout with the old log-probs recomputed, as TRL computes them
    with ``num_iterations`` > 1 or its IS correction), with ``group.field`` overrides."""
    groups: dict[str, Any] = {
        "update": UpdateSettings(ppo_epochs=2, recompute_old_log_probs=True),
        "rollout": RolloutSettings(samples_per_prompt=G),
        "advantage": AdvantageSettings(eps=1e-4),
        "loss": PolicyLossSettings(),
        "mismatch": MismatchSettings(correction="none"),
        "kl": KLSettings(),
        "optim": OptimSettings(),
    }
    by_group: dict[str, dict[str, Any]] = {}
    for key, value in dotted.items():
        group, name = key.split(".")
        by_group.setdefault(group, {})[name] = value
    for group, changes in by_group.items():
        groups[group] = dataclasses.replace(groups[group], **changes)
    return PPOSettings(**groups)


def lit_loss(settings: PPOSettings, *, temperature: float = 1.0) -> tuple[Tensor, dict]:
    """lit-rlhf's loss and gradients: its collector, ``PolicyStep.prepare`` (advantages, old
    and reference log-probs under the old weights, the overlong filter), then the current
    weights and ``PPOUpdate.loss`` summed over the micro-batches of one mini-batch."""
    sc = scenario()
    policy = load_model(sc.model_dir, sc.weights.old)
    kl_on = settings.kl.coef > 0
    ref = load_model(sc.model_dir, sc.weights.ref).eval() if kl_on else None
    collector = RolloutCollector(ScriptedEngine(temperature), scripted_reward)
    step = PolicyStep(settings, collector)
    module = SimpleNamespace(
        policy=policy, ref_policy=ref, critic=None, tokenizer=sc.tokenizer,
        kl_coef=settings.kl.coef, rollout_step=0, trainer=None,
    )  # fmt: skip
    # the data batch: each prompt once (G // samples_per_prompt times for a smaller group, so
    # that the engine still sees the scenario's rows)
    copies = G // settings.rollout.samples_per_prompt
    prompt_ids, prompt_mask = _left_padded([p for p in PROMPTS for _ in range(copies)], 0)
    prompt_ids = prompt_ids.masked_fill(~prompt_mask, sc.tokenizer.pad_token_id)
    n = len(prompt_ids)
    batch = {
        "prompt": [f"p{i}" for i in range(n)],
        "row": [{"index": i} for i in range(n)],
        "query_id": [str(i) for i in range(n)],
        "task": ["parity"] * n,
        "input_ids": prompt_ids,
        "attention_mask": prompt_mask.long(),
    }
    rollout = step.collect(module, batch)
    experience = step.prepare(module, rollout)
    policy.load_state_dict(sc.weights.cur)
    update = PPOUpdate(
        policy, settings, experience, temperature=temperature, kl_coef=settings.kl.coef,
        use_current_as_old=settings.single_update(len(experience)), mismatch=step.mismatch,
        norm_length=step.norm_length,
    )  # fmt: skip
    index = torch.arange(len(experience))
    loss = sum(update.loss(mb) for mb in update.micro_batches(index))
    assert isinstance(loss, Tensor)
    loss.backward()
    return loss.detach(), _grads(policy)


# --------------------------------------------------------------------------------------- TRL


def _rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
    sc = scenario()
    engine = engine_log_probs(trainer.temperature)
    lengths = sc.response_mask.sum(1).tolist()

    def unpadded(rows: Tensor) -> list[list]:
        return [row[:n] for row, n in zip(rows.tolist(), lengths, strict=True)]

    return {
        "prompt_ids": [p for p in PROMPTS for _ in range(G)],
        "completion_ids": unpadded(sc.response_ids),
        "logprobs": unpadded(engine),
    }


def trl_trainer(config: dict[str, Any], attrs: dict[str, Any], tmp: str) -> Any:
    """A GRPOTrainer on the scenario (built with the reference weights, so its reference model
    holds them), the old weights loaded, ``attrs`` set on the built trainer."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    sc = scenario()
    base = {
        "output_dir": tmp, "report_to": "none", "use_cpu": True, "bf16": False,
        "per_device_train_batch_size": sc.batch_size, "num_generations": G,
        "max_completion_length": MAX_NEW, "num_iterations": 2, "beta": 0.0,
        "use_bias_correction_kl": False, "logging_steps": 1, "save_strategy": "no",
    }  # fmt: skip
    args = GRPOConfig(**{**base, **config})
    data = Dataset.from_dict({"prompt": ["p0", "p1"] * G})
    model = load_model(sc.model_dir, sc.weights.ref)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[scripted_reward], args=args, train_dataset=data,
        processing_class=sc.tokenizer, rollout_func=_rollout_func,
    )  # fmt: skip
    trainer.model.load_state_dict(sc.weights.old)
    trainer.model.train()
    for name, value in attrs.items():
        setattr(trainer, name, value)
    if trainer.use_vllm:  # no vLLM behind it: rollout_func would ask it to sync weights
        trainer._last_loaded_step = trainer.state.global_step
    return trainer


def trl_loss(
    config: dict[str, Any], attrs: dict[str, Any], tmp: str, *, micro_batches: int = 1
) -> tuple[Tensor, dict, dict]:
    """TRL's loss and gradients: ``_generate_and_score_completions`` under the old weights, then
    ``compute_loss`` under the current ones on each of ``micro_batches`` row blocks (gradient
    accumulation: ``current_gradient_accumulation_steps`` = their number), summed. Also returns
    the inputs ``compute_loss`` read."""
    sc = scenario()
    trainer = trl_trainer(config, attrs, tmp)
    prompts = [{"prompt": f"p{i // G}"} for i in range(sc.batch_size)]
    inputs = trainer._generate_and_score_completions(prompts)
    trainer.model.load_state_dict(sc.weights.cur)
    trainer.current_gradient_accumulation_steps = micro_batches
    size = sc.batch_size // micro_batches
    total = torch.zeros(())
    for start in range(0, sc.batch_size, size):
        part = {
            k: v[start : start + size] if isinstance(v, Tensor) and v.dim() > 0 else v
            for k, v in inputs.items()
        }
        loss = trainer.compute_loss(trainer.model, part)
        loss.backward()
        total = total + loss.detach()
    return total, _grads(trainer.model), inputs


def _grads(model: nn.Module) -> dict[str, Tensor]:
    return {
        k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for k, p in model.named_parameters()
    }


def gap(a: tuple[Tensor, dict], b: tuple[Tensor, dict]) -> float:
    """The larger of the relative loss gap and the largest gradient gap relative to the
    largest gradient entry."""
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    loss_gap = abs(float(loss_a - loss_b)) / max(abs(float(loss_a)), 1e-3)
    scale = max(float(g.abs().max()) for g in grads_a.values())
    grad_gap = max(float((grads_a[k] - grads_b[k]).abs().max()) for k in grads_a) / scale
    return max(loss_gap, grad_gap)
