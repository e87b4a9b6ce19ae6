import pytest
import torch
import torch.nn.functional as F

from lit_rlhf.algos import entropy_and_top1, entropy_from_logits, token_log_probs


def _logits(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * 3).to(dtype)


def test_entropy_matches_categorical():
    logits = _logits(2, 5, 11)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)


@pytest.mark.parametrize("chunk_size", [1, 4, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_and_top1_one_pass_matches_references(chunk_size, dtype):
    logits = _logits(3, 5, 17, dtype=dtype).requires_grad_()
    entropy, top1 = entropy_and_top1(logits, chunk_size=chunk_size)
    reference = torch.distributions.Categorical(logits=logits.detach().float())
    assert entropy.dtype == top1.dtype == torch.float32 and not entropy.requires_grad
    torch.testing.assert_close(entropy, reference.entropy())
    torch.testing.assert_close(top1, reference.probs.max(-1).values)


def test_entropy_uniform_is_log_vocab():
    # uniform over V = 8 tokens: H = log 8
    entropy = entropy_from_logits(torch.zeros(3, 8))
    torch.testing.assert_close(entropy, torch.full((3,), 8.0).log())


@pytest.mark.parametrize("chunk_size", [1, 3, 7, None])
def test_entropy_chunked_equals_unchunked_with_gradients(chunk_size):
    reference_input = _logits(2, 5, 11).requires_grad_()
    reference = torch.distributions.Categorical(logits=reference_input).entropy()
    (reference_grad,) = torch.autograd.grad(reference.sum(), reference_input)

    chunked_input = reference_input.detach().clone().requires_grad_()
    chunked = entropy_from_logits(chunked_input, chunk_size=chunk_size)
    (chunked_grad,) = torch.autograd.grad(chunked.sum(), chunked_input)
    torch.testing.assert_close(chunked, reference)
    torch.testing.assert_close(chunked_grad, reference_grad)


def test_entropy_of_bf16_is_fp32_with_matching_gradient():
    bf16 = _logits(3, 4, 32, dtype=torch.bfloat16).requires_grad_()
    entropy = entropy_from_logits(bf16, chunk_size=5)
    assert entropy.dtype == torch.float32
    (grad,) = torch.autograd.grad(entropy.sum(), bf16)
    assert grad.dtype == torch.bfloat16

    upcast = bf16.detach().float().requires_grad_()
    reference = torch.distributions.Categorical(logits=upcast).entropy()
    (reference_grad,) = torch.autograd.grad(reference.sum(), upcast)
    torch.testing.assert_close(entropy, reference)
    # the only difference is rounding the fp32 gradient to bf16 on the way back: at most one
    # bf16 ulp (relative 2**-8) where the two fp32 formulas straddle a rounding boundary
    torch.testing.assert_close(grad.float(), reference_grad, rtol=2**-8, atol=1e-6)


def test_entropy_without_grad_and_empty_input():
    with torch.no_grad():
        assert entropy_from_logits(_logits(4, 6), chunk_size=3).shape == (4,)
    assert entropy_from_logits(torch.zeros(0, 5, 7)).shape == (0, 5)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(torch.zeros(2, 3), chunk_size=0)


@pytest.mark.parametrize("chunk_size", [1, 4, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_log_probs_matches_log_softmax_gather(chunk_size, dtype):
    logits = _logits(2, 6, 13, dtype=dtype).requires_grad_()
    labels = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(1))
    log_probs = token_log_probs(logits, labels, chunk_size=chunk_size)
    assert log_probs.dtype == torch.float32
    (grad,) = torch.autograd.grad(log_probs.sum(), logits)

    upcast = logits.detach().float().requires_grad_()
    reference = F.log_softmax(upcast, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    (reference_grad,) = torch.autograd.grad(reference.sum(), upcast)
    torch.testing.assert_close(log_probs, reference)
    torch.testing.assert_close(grad.float(), reference_grad.to(dtype).float())


def test_token_log_probs_rejects_misshaped_labels():
    with pytest.raises(ValueError, match="labels shape"):
        token_log_probs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("fn", ["entropy", "log_probs"])
def test_backward_writes_one_gradient_buffer_and_matches_autograd(fn):
    # float64 against plain autograd through log_softmax, chunks that do not divide the rows
    logits = _logits(3, 7, 13, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, 13, (3, 7), generator=torch.Generator().manual_seed(1))
    weights = torch.randn(3, 7, dtype=torch.float64)
    if fn == "entropy":
        out = entropy_from_logits(logits, chunk_size=4)
        log_p = F.log_softmax(logits, -1)
        reference = -(log_p.exp() * log_p).sum(-1)
    else:
        out = token_log_probs(logits, labels, chunk_size=4)
        reference = F.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    assert out.dtype == torch.float64
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    (reference_grad,) = torch.autograd.grad((reference * weights).sum(), logits)
    torch.testing.assert_close(out, reference)
    torch.testing.assert_close(grad, reference_grad)
    assert torch.autograd.gradcheck(
        lambda z: (
            entropy_from_logits(z, chunk_size=2)
            if fn == "entropy"
            else token_log_probs(z, labels[:1], chunk_size=2)
        ),
        (logits[:1].detach().clone().requires_grad_(),),
    )
