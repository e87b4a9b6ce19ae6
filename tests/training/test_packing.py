"""Token-budget planning and the packed, chunked forward (``lit_rlhf.training.packing``,
``lit_rlhf.models.chunked``)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_rlhf.models import resolve
from lit_rlhf.models.chunked import pack_rows, packed_response_forward
from lit_rlhf.models.forward import forward_response
from lit_rlhf.training.packing import group_minibatches, plan_token_budget


def _random_plan_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    gen = torch.Generator().manual_seed(seed)
    group_size = int(torch.randint(2, 9, (1,), generator=gen))
    n_groups = int(torch.randint(1, 7, (1,), generator=gen))
    groups = torch.arange(n_groups).repeat_interleave(group_size)
    # lognormal lengths 16..256: a long tail
    tokens = torch.empty(len(groups)).log_normal_(4.0, 0.8, generator=gen).clamp(16, 256).long()
    budget = int(torch.randint(64, 1024, (1,), generator=gen))
    rows = torch.randperm(len(groups), generator=gen)
    return rows, tokens[rows], groups[rows], budget


@pytest.mark.parametrize("seed", range(40))
def test_a_plan_covers_every_row_once_within_budget_keeping_groups(seed):
    rows, tokens, groups, budget = _random_plan_case(seed)
    plan = plan_token_budget(rows, tokens, groups, budget)
    seen = torch.cat(plan).tolist()
    assert sorted(seen) == sorted(rows.tolist())  # every row exactly once
    where = {int(r): i for i, r in enumerate(rows.tolist())}
    for micro in plan:
        total = sum(int(tokens[where[int(r)]]) for r in micro)
        assert total <= budget or len(micro) == 1  # a row over the budget goes alone
    bin_of = {int(r): k for k, micro in enumerate(plan) for r in micro}
    for g in groups.unique().tolist():
        members = [int(r) for r, gg in zip(rows, groups, strict=True) if gg == g]
        if sum(int(tokens[where[m]]) for m in members) <= budget:
            assert len({bin_of[m] for m in members}) == 1  # a group that fits is never split


def test_a_row_longer_than_the_budget_goes_alone():
    rows, tokens, groups = torch.arange(3), torch.tensor([100, 5, 5]), torch.tensor([0, 1, 1])
    plan = plan_token_budget(rows, tokens, groups, 20)
    assert [p.tolist() for p in plan] == [[0], [1, 2]]


def test_group_minibatches_keep_groups_whole_and_cover_every_row():
    groups = torch.arange(6).repeat_interleave(4)[torch.randperm(24)]
    batches = group_minibatches(groups, 8, generator=torch.Generator().manual_seed(0))
    assert sorted(torch.cat(batches).tolist()) == list(range(24))
    for batch in batches:
        assert len(batch) == 8 and all((groups[batch] == g).sum() == 4 for g in groups[batch])


@pytest.fixture(scope="module", params=["builtin:tiny-llama", "builtin:tiny-qwen2"])
def model(request):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(resolve(request.param)).train()


def _batch(vocab: int):
    gen = torch.Generator().manual_seed(1)
    p_len, r_len = torch.tensor([3, 7, 5, 1]), torch.tensor([6, 1, 4, 9])
    b, p, r = 4, 7, 9
    prompt_mask = torch.arange(p)[None] >= (p - p_len)[:, None]  # left-padded
    response_mask = torch.arange(r)[None] < r_len[:, None]  # right-padded
    prompt = torch.randint(0, vocab, (b, p), generator=gen) * prompt_mask
    response = torch.randint(0, vocab, (b, r), generator=gen) * response_mask
    return prompt, prompt_mask, response, response_mask


@pytest.mark.parametrize("chunk_tokens", [1024, 5])
def test_a_packed_forward_equals_the_per_sequence_forward(model, chunk_tokens):
    """Position ids restarting per sequence and no attention mask: transformers' sdpa/eager
    attention masks each packed sequence off from the others."""
    prompt, p_mask, response, r_mask = _batch(model.config.vocab_size)
    packed = pack_rows(prompt, p_mask, response, r_mask)
    out = packed_response_forward(
        model, packed, temperature=0.8, with_hidden=True, chunk_tokens=chunk_tokens,
        num_chunks=lambda k: k + 2,  # extra empty chunks, as ranks agreeing on a count run
    )  # fmt: skip
    for i in range(len(prompt)):  # each sequence alone, unpadded
        ids = torch.cat([prompt[i][p_mask[i]], response[i][r_mask[i]]])[None]
        alone = forward_response(
            model, ids, torch.ones_like(ids, dtype=torch.bool), response[i][r_mask[i]][None],
            temperature=0.8, with_hidden=True,
        )  # fmt: skip
        n = int(r_mask[i].sum())
        assert torch.allclose(out.log_probs[i, :n], alone.log_probs[0], atol=1e-5)
        assert out.hidden is not None and alone.hidden is not None
        assert torch.allclose(out.hidden[i, :n], alone.hidden[0], atol=1e-5)
        assert (out.log_probs[i, n:] == 0).all()


def test_chunked_log_probs_backpropagate_like_full_logits(model):
    prompt, p_mask, response, r_mask = _batch(model.config.vocab_size)
    packed = pack_rows(prompt, p_mask, response, r_mask)
    grads = []
    for full in (True, False):
        model.zero_grad()
        out = packed_response_forward(
            model, packed, temperature=1.0, full_logits=full, chunk_tokens=4
        )
        (out.log_probs.sum() + 0.0 * out.entropy.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        assert (out.logits is not None) == full
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-5), name


def test_packing_refuses_rows_without_a_prompt_token():
    with pytest.raises(ValueError, match="prompt token"):
        pack_rows(
            torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.bool),
            torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool),
        )  # fmt: skip
