"""The measurement of the MGS measurement study (scripts/repro/mgs_measure.py): one batch of
prompt groups sampled and scored by the shipped rollout path, one gradient per prompt group from
the shipped GRPO pieces, their per-module Gram matrices, and the conflict figures of any labelling
of the groups (true domains or a permutation) from those matrices alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.algos.advantages import group_advantages
from lit_rlhf.algos.gradient_surgery import conflict_summary, group_parameters, permute_task_labels
from lit_rlhf.algos.ppo_losses import clipped_policy_loss
from lit_rlhf.data.prompt_batches import collate_prompts
from lit_rlhf.models.forward import forward_response
from lit_rlhf.types import Rollout

_CHUNK = 1 << 22  # gradient entries per float32 block of the Gram products
# figure -> (granularity, ConflictSummary field)
FIGURES = {
    "module_conflict": ("module", "conflict_fraction"),
    "global_conflict": ("global", "conflict_fraction"),
    "module_cosine": ("module", "cosine_mean"),
    "global_cosine": ("global", "cosine_mean"),
    "module_removed": ("module", "removed_share"),
    "global_removed": ("global", "removed_share"),
    "undefined_pairs": ("global", "undefined_pairs"),
}


def sample_batch(
    collector: Any, policy: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], *,
    samples: int, bf16: bool,
) -> Rollout:  # fmt: skip
    """The rollout of ``rows`` (``samples`` responses each), as training samples and scores it."""
    batch = collate_prompts(list(rows), pad_token_id=tokenizer.pad_token_id)
    device = next(policy.parameters()).device  # the GPU window's policy is on CUDA
    batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return collector.collect(policy, tokenizer, batch, samples_per_prompt=samples,
                                 log_probs=False)  # fmt: skip


def module_groups(policy: Any) -> dict[str, list[str]]:
    """The trainable parameters grouped as ``granularity: module`` groups them."""
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    return group_parameters(names, "module")


def group_grams(
    policy: Any, rollout: Rollout, modules: Mapping[str, list[str]], *, temperature: float,
    bf16: bool,
) -> tuple[Tensor, list[int]]:  # fmt: skip
    """[M, G, G] float64: per module, the inner products of the G prompt groups' gradients of the
    GRPO loss (std-scaled group advantages, PPO's clipped loss at ratio 1, the token mean over
    the whole batch: the step's gradient at a fixed policy, split by group); and the live groups
    (those whose rewards do not all tie: the others' gradient is exactly 0)."""
    group_ids = rollout.group_ids.cpu()
    n_groups = int(group_ids.max()) + 1
    device = rollout.input_ids.device
    adv = group_advantages(rollout.scores.cpu(), group_ids)
    adv_on_device = adv.to(device)
    live = [g for g in range(n_groups) if bool(adv[group_ids == g].abs().sum() > 0)]
    params = dict(policy.named_parameters())
    order = [n for names in modules.values() for n in names]
    sizes = [params[n].numel() for n in order]
    n_tokens = rollout.response_mask.sum().clamp(min=1)
    flat = torch.empty(len(live), sum(sizes), dtype=torch.bfloat16)  # bf16: 2 bytes per entry
    for k, group in enumerate(live):
        rows = (group_ids == group).nonzero().squeeze(1).to(device)
        policy.zero_grad(set_to_none=True)
        mask = rollout.response_mask[rows]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            fwd = forward_response(policy, rollout.input_ids[rows], rollout.attention_mask[rows],
                                   rollout.response_ids[rows], temperature=temperature)  # fmt: skip
        per_token, _ = clipped_policy_loss(fwd.log_probs, fwd.log_probs.detach(),
                                           adv_on_device[rows, None].expand(mask.shape),
                                           mask)  # fmt: skip
        (per_token.sum() / n_tokens).backward()
        grads = [params[n].grad for n in order]
        flat[k] = torch.cat([(g if g is not None else torch.zeros_like(params[n])).reshape(-1)
                             for n, g in zip(order, grads, strict=True)])  # fmt: skip
    policy.zero_grad(set_to_none=True)
    grams = torch.zeros(len(modules), n_groups, n_groups, dtype=torch.float64)
    index, start = torch.tensor(live, dtype=torch.long), 0
    for m, names in enumerate(modules.values()):
        width = sum(params[n].numel() for n in names)
        gram = torch.zeros(len(live), len(live), dtype=torch.float64)
        for lo in range(start, start + width, _CHUNK):  # float32 copies of a bounded size
            block = flat[:, lo : min(lo + _CHUNK, start + width)].float()
            gram += (block @ block.T).double()
        if live:
            grams[m][index[:, None], index[None, :]] = gram
        start += width
    return grams, live


def labelled_figures(
    grams: Tensor, modules: Sequence[str], labels: Sequence[str], *, seed: int
) -> dict[str, float]:
    """The conflict figures (:data:`FIGURES`) when group g belongs to domain ``labels[g]``: each
    domain's gradient is the sum of its groups', so its Gram matrix is ``A^T G A``."""
    domains = sorted(set(labels))
    onehot = torch.zeros(len(labels), len(domains), dtype=torch.float64)
    for g, label in enumerate(labels):
        onehot[g, domains.index(label)] = 1.0
    by_module = {m: onehot.T @ grams[i] @ onehot for i, m in enumerate(modules)}
    out: dict[str, float] = {}
    for granularity, groups in (("module", {m: [m] for m in modules}),
                                ("global", {"all": list(modules)})):  # fmt: skip
        summary = conflict_summary(by_module, groups,
                                   generator=torch.Generator().manual_seed(seed))  # fmt: skip
        for name, (level, field) in FIGURES.items():
            if level == granularity:
                out[name] = float(getattr(summary, field))
    return out


def batch_figures(
    grams: Tensor, modules: Sequence[str], labels: Sequence[str], *, permutations: int, seed: int
) -> dict[str, Any]:
    """The true labelling's figures, and the null's: each figure's mean over ``permutations``
    in-batch permutations of the labels (whole groups move, each domain keeps its size), over
    those where it is defined (and how many that is)."""
    true = labelled_figures(grams, modules, labels, seed=seed)
    draws: dict[str, list[float]] = {k: [] for k in true}
    generator = torch.Generator().manual_seed(seed)
    for _ in range(permutations):
        shuffled = permute_task_labels(labels, list(range(len(labels))), generator=generator)
        for key, value in labelled_figures(grams, modules, shuffled, seed=seed).items():
            draws[key].append(value)
    null = {k: statistics.fmean(d) if (d := [x for x in v if math.isfinite(x)]) else math.nan
            for k, v in draws.items()}  # fmt: skip
    defined = {k: sum(math.isfinite(x) for x in v) for k, v in draws.items()}
    return {"true": true, "null": null, "null_defined": defined}
