import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.algos import trust_region_entropy


def _reference(
    logits: torch.Tensor, *, mode: str, k: int, p: float, max_candidates: int, scale: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Naive TRE: fully sort every position in float64.

    Returns (entropy [N], region size [N], distance of p from the nearest candidate's preceding
    mass [N], so callers can skip positions where fp32 rounding may legitimately flip a token).
    """
    rows = logits.detach().double().reshape(-1, logits.shape[-1])
    vocab = rows.shape[-1]
    entropies, sizes, margins = [], [], []
    for row in rows:
        sorted_logits = torch.sort(row, descending=True).values
        margin = math.inf
        if mode == "topk":
            size = k
        else:
            probs = torch.softmax(sorted_logits, dim=-1)
            before = (torch.cumsum(probs, dim=-1) - probs)[: min(max_candidates, vocab)]
            # `before` is non-decreasing, so the tokens with before < p form a prefix
            size = int((before < p).sum())
            margin = float((before - p).abs().min())
        q = torch.softmax(sorted_logits[:size], dim=-1)
        entropy = float(-(q * q.log()).sum())
        if scale:
            entropy = entropy * math.log(vocab) / math.log(size) if size > 1 else 0.0
        entropies.append(entropy)
        sizes.append(size)
        margins.append(margin)
    return torch.tensor(entropies), torch.tensor(sizes), torch.tensor(margins)


def _distinct_logits(*lead: int, vocab: int, step: float = 0.25, seed: int = 0) -> torch.Tensor:
    """Tie-free logits (a random permutation of a grid per row), exact in bf16 for vocab <= 64."""
    gen = torch.Generator().manual_seed(seed)
    n = math.prod(lead)
    grid = torch.stack([torch.randperm(vocab, generator=gen) for _ in range(n)]).float()
    return (grid * step - 4.0).reshape(*lead, vocab)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 6),
    vocab=st.integers(5, 40),
    spread=st.sampled_from([0.3, 1.0, 3.0, 8.0]),
    mode=st.sampled_from(["topk", "topp"]),
    k=st.sampled_from([1, 2, 3, 5]),
    p=st.sampled_from([0.2, 0.5, 0.7, 0.9, 0.95, 0.99]),
    max_candidates=st.sampled_from([1, 3, 8, 256]),
    scale=st.booleans(),
    chunk_size=st.sampled_from([1, 2, None]),
)
def test_matches_naive_full_sort_reference(
    seed, rows, vocab, spread, mode, k, p, max_candidates, scale, chunk_size
):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * spread
    entropy, size = trust_region_entropy(
        logits,
        mode=mode,
        k=k,
        p=p,
        max_candidates=max_candidates,
        scale=scale,
        chunk_size=chunk_size,
    )
    expected, expected_size, margin = _reference(
        logits, mode=mode, k=k, p=p, max_candidates=max_candidates, scale=scale
    )
    assert entropy.dtype == torch.float32 and size.dtype == torch.long
    decided = margin > 1e-5  # elsewhere fp32 vs fp64 rounding of the mass may flip one token
    torch.testing.assert_close(size[decided], expected_size[decided])
    torch.testing.assert_close(
        entropy[decided].double(), expected[decided].double(), atol=2e-5, rtol=1e-5
    )
    if mode == "topk":
        assert (size == k).all()


def test_topp_keeps_the_token_that_crosses_p():
    # probabilities 0.5, 0.3, 0.15, 0.05: preceding masses 0, 0.5, 0.8, 0.95
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(4, 4)
    p = torch.tensor([0.5, 0.51, 0.79, 0.81])
    sizes = [
        int(trust_region_entropy(row, mode="topp", p=float(pi))[1])
        for row, pi in zip(logits, p, strict=True)
    ]
    # p = 0.5: only the top token (0.5 is not < 0.5); p = 0.51: the second crosses p, so it is in;
    # p = 0.79: 0.8 is not < 0.79, so 2; p = 0.81: the third token (mass before 0.8) crosses.
    assert sizes == [1, 2, 2, 3]
    entropy, _ = trust_region_entropy(logits[0], mode="topp", p=0.79, scale=False)
    # q = (0.5, 0.3) / 0.8 = (0.625, 0.375): H = -(0.625 ln 0.625 + 0.375 ln 0.375) = 0.66156
    torch.testing.assert_close(entropy, torch.tensor(0.661563), atol=1e-5, rtol=0)
    scaled, _ = trust_region_entropy(logits[0], mode="topp", p=0.79)
    # scale log|V| / log|A| = ln 4 / ln 2 = 2
    torch.testing.assert_close(scaled, 2 * entropy)


@pytest.mark.parametrize(
    ("mode", "kwargs"),
    [("topk", {"k": 1}), ("topk", {"k": 3}), ("topp", {"p": 0.6}), ("topp", {"p": 0.97})],
)
def test_gradient_is_zero_outside_the_region_and_sums_to_zero_inside(mode, kwargs):
    logits = (torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(3)) * 2).double()
    logits.requires_grad_()
    entropy, size = trust_region_entropy(logits, mode=mode, chunk_size=4, **kwargs)
    (grad,) = torch.autograd.grad(entropy.sum(), logits)

    ranks = torch.argsort(torch.argsort(logits.detach(), dim=-1, descending=True), dim=-1)
    in_region = ranks < size.unsqueeze(-1)
    assert (grad[~in_region] == 0).all()
    torch.testing.assert_close(grad.sum(-1), torch.zeros_like(entropy.double()), atol=1e-12, rtol=0)
    # non-vacuous: positions with a region of 2+ tokens do get a gradient
    assert (grad.abs().sum(-1)[size > 1] > 0).all()


def test_equal_top_two_logits_give_log_vocab_scaled_and_log_two_unscaled():
    logits = torch.tensor([[3.0, 3.0, 0.0, -1.0, 2.0, 1.0, 0.5, -2.0]]).requires_grad_()
    scaled, size = trust_region_entropy(logits, k=2)
    unscaled, _ = trust_region_entropy(logits, k=2, scale=False)
    assert size.tolist() == [2]
    torch.testing.assert_close(scaled, torch.tensor([math.log(8)]))
    torch.testing.assert_close(unscaled, torch.tensor([math.log(2)]))
    # a uniform region is the maximum of H_TR: the gradient vanishes everywhere
    (grad,) = torch.autograd.grad(scaled.sum(), logits)
    torch.testing.assert_close(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("scale", [True, False])
def test_single_token_region_is_exactly_zero_with_finite_zero_gradient(scale):
    # softmax of [12, 0 x 9]: top-1 prob = 1 / (1 + 9 e^-12) ~ 0.99999, above p = 0.99
    logits = torch.tensor([[12.0] + [0.0] * 9, [0.0] * 10]).requires_grad_()
    entropy, size = trust_region_entropy(logits, mode="topp", p=0.99, scale=scale)
    assert size.tolist() == [1, 10]
    assert entropy[0].item() == 0.0
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    assert torch.isfinite(grad).all()
    assert (grad[0] == 0).all()

    k1, k1_size = trust_region_entropy(logits, k=1, scale=scale)
    assert k1_size.tolist() == [1, 1] and (k1 == 0).all()
    (k1_grad,) = torch.autograd.grad(k1.sum(), logits)
    assert (k1_grad == 0).all()


def test_topp_candidate_cap_and_p_equal_one():
    # uniform over 8: preceding masses 0, 1/8, ..., 7/8 are all < 1, so every token is in
    entropy, size = trust_region_entropy(torch.zeros(2, 8), mode="topp", p=1.0)
    assert size.tolist() == [8, 8]
    torch.testing.assert_close(entropy, torch.full((2,), math.log(8)))
    _, capped = trust_region_entropy(torch.zeros(2, 8), mode="topp", p=1.0, max_candidates=5)
    assert capped.tolist() == [5, 5]


def test_minus_inf_logits_never_enter_the_region():
    logits = torch.tensor([[1.0, 1.0, float("-inf"), float("-inf")]]).requires_grad_()
    entropy, size = trust_region_entropy(logits, k=3)
    # only two tokens have nonzero probability: uniform over them, scaled to log 4
    assert size.tolist() == [2]
    torch.testing.assert_close(entropy, torch.tensor([math.log(4)]))
    _, topp_size = trust_region_entropy(logits, mode="topp", p=1.0)
    assert topp_size.tolist() == [2]
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("mode", ["topk", "topp"])
def test_bf16_gives_fp32_matching_the_fp32_computation_of_the_cast_logits(mode):
    bf16 = _distinct_logits(3, 4, vocab=64).bfloat16().requires_grad_()
    entropy, size = trust_region_entropy(bf16, mode=mode, k=3, p=0.9, chunk_size=5)
    assert entropy.dtype == torch.float32
    (grad,) = torch.autograd.grad(entropy.sum(), bf16)
    assert grad.dtype == torch.bfloat16

    upcast = bf16.detach().float().requires_grad_()
    reference, reference_size = trust_region_entropy(upcast, mode=mode, k=3, p=0.9)
    (reference_grad,) = torch.autograd.grad(reference.sum(), upcast)
    torch.testing.assert_close(entropy, reference)
    assert torch.equal(size, reference_size)
    # the only difference is rounding the fp32 gradient to bf16 on the way back
    torch.testing.assert_close(grad.float(), reference_grad.bfloat16().float())


@pytest.mark.parametrize("mode", ["topk", "topp"])
@pytest.mark.parametrize("chunk_size", [1, 3, 7])
def test_chunked_equals_unchunked_with_gradients(mode, chunk_size):
    whole_input = _distinct_logits(2, 5, vocab=30, step=0.4, seed=1).requires_grad_()
    whole, whole_size = trust_region_entropy(whole_input, mode=mode, p=0.9, chunk_size=None)
    (whole_grad,) = torch.autograd.grad(whole.sum(), whole_input)

    chunked_input = whole_input.detach().clone().requires_grad_()
    chunked, chunked_size = trust_region_entropy(
        chunked_input, mode=mode, p=0.9, chunk_size=chunk_size
    )
    (chunked_grad,) = torch.autograd.grad(chunked.sum(), chunked_input)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(chunked_grad, whole_grad)
    assert torch.equal(chunked_size, whole_size)


@pytest.mark.parametrize("mode", ["topk", "topp"])
def test_backward_keeps_no_fp32_vocab_sized_tensor(mode):
    # What autograd saves must be [rows, candidates]; only the bf16 input itself is vocab-sized.
    vocab, chunk = 512, 4
    logits = _distinct_logits(2, 6, vocab=64).repeat(1, 1, vocab // 64).bfloat16()
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trust_region_entropy(
            logits.requires_grad_(), mode=mode, max_candidates=16, chunk_size=chunk
        )
    assert saved
    for tensor in saved:
        vocab_sized = tensor.dim() > 0 and tensor.shape[-1] == vocab
        assert not vocab_sized or tensor.dtype == torch.bfloat16, (tensor.dtype, tensor.shape)


def test_no_grad_empty_input_and_leading_shape():
    with torch.no_grad():
        entropy, size = trust_region_entropy(torch.randn(2, 3, 4, 9), mode="topp")
    assert entropy.shape == size.shape == (2, 3, 4)
    empty, empty_size = trust_region_entropy(torch.zeros(0, 5, 7), mode="topp")
    assert empty.shape == empty_size.shape == (0, 5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "nucleus"}, "mode"),
        ({"k": 0}, "k"),
        ({"k": 11}, "exceeds the vocabulary"),
        ({"mode": "topp", "p": 0.0}, "p"),
        ({"mode": "topp", "p": 1.5}, "p"),
        ({"mode": "topp", "max_candidates": 0}, "max_candidates"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_rejects_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        trust_region_entropy(torch.zeros(2, 10), **kwargs)
