import pytest
import torch

from lit_rlhf.models import load_causal_lm, load_tokenizer
from lit_rlhf.models.forward import forward_response


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)


def _batch(tokenizer, groups):
    # G = 3 samples per prompt, prompts of different lengths (left padding), responses with
    # padding after an early end
    prompts = [
        q for q in ["hello there", "Using the numbers [1, 2]", "abc"][:groups] for _ in "xyz"
    ]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    gen = torch.Generator().manual_seed(0)
    response = torch.randint(6, len(tokenizer), (len(prompts), 7), generator=gen)
    response_mask = torch.ones_like(response, dtype=torch.bool)
    response_mask[0, 4:] = False
    response_mask[-1, 2:] = False
    response = response.masked_fill(~response_mask, tokenizer.pad_token_id)
    ids = torch.cat([enc.input_ids, response], 1)
    attn = torch.cat([enc.attention_mask.bool(), response_mask], 1)
    return ids, attn, response, response_mask


@pytest.mark.parametrize("groups", [1, 3])
def test_shared_prompt_forward_equals_plain_forward_with_gradients(tiny, groups):
    tokenizer, model = tiny
    ids, attn, response, mask = _batch(tokenizer, groups)
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    results = []
    for share in (False, True):
        model.zero_grad()
        out = forward_response(model, ids, attn, response, temperature=0.7, share_prompts=share)
        (out.log_probs * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits.detach(), out.log_probs.detach(), grads))
    (plain_logits, plain_lp, plain_grads), (logits, lp, grads) = results
    torch.testing.assert_close(logits[mask], plain_logits[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp[mask], plain_lp[mask], atol=1e-5, rtol=1e-5)
    assert plain_grads.keys() == grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_distinct_prompts_take_the_plain_path(tiny, monkeypatch):
    import lit_rlhf.models.forward as pf

    tokenizer, model = tiny
    ids, attn, response, _ = _batch(tokenizer, 3)
    calls = []
    real = pf._shared_prompt_forward
    monkeypatch.setattr(
        pf, "_shared_prompt_forward", lambda *a: calls.append(real(*a)) or calls[-1]
    )
    rows = torch.tensor([0, 3, 6])  # one sample of each prompt: nothing to share
    forward_response(model, ids[rows], attn[rows], response[rows], temperature=1.0)
    forward_response(model, ids, attn, response, temperature=1.0)
    assert calls[0] is None and calls[1] is not None


def test_gradient_checkpointing_keeps_the_prompt_in_the_training_forward(tiny_model_dir):
    # transformers drops the KV cache in a training-mode forward with gradient checkpointing: the
    # shared-prompt path would then compute the responses' log-probs without the prompt
    # (a 0.28 difference on a tiny model). The result must equal the plain forward's.
    tokenizer, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)
    ids, attn, response, mask = _batch(tokenizer, 3)
    model.gradient_checkpointing_enable()
    model.train()
    plain = forward_response(model, ids, attn, response, temperature=1.0, share_prompts=False)
    shared = forward_response(model, ids, attn, response, temperature=1.0, share_prompts=True)
    torch.testing.assert_close(shared.log_probs[mask], plain.log_probs[mask], atol=1e-5, rtol=1e-5)
    shared.log_probs[mask].sum().backward()  # and gradients flow through the checkpointed path
    assert any(p.grad is not None for p in model.parameters())
