import shutil

import pytest
import torch
from transformers import TopPLogitsWarper

from lit_rlhf.models import load_causal_lm, load_tokenizer
from lit_rlhf.models.forward import forward_response
from lit_rlhf.rollout import DecodeLoopEngine, HFGenerationEngine, filter_logits, sample_categorical

PROMPTS = ["hello there", "Using the numbers [1, 2]", "abc"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)


def _enc(tokenizer):
    return tokenizer(PROMPTS, return_tensors="pt", padding=True)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_greedy_tokens_equal_hf_generate(tiny, cache):
    # left-padded prompts of different lengths: positions and masks must match generate's
    tokenizer, model = tiny
    enc = _enc(tokenizer)
    assert (enc.attention_mask == 0).any()
    ours = DecodeLoopEngine(max_new_tokens=12, cache=cache).generate(
        model, enc.input_ids, enc.attention_mask, tokenizer, greedy=True
    )
    hf = HFGenerationEngine(max_new_tokens=12).generate(
        model, enc.input_ids, enc.attention_mask, tokenizer, greedy=True
    )
    assert torch.equal(ours.response_mask, hf.response_mask)
    assert torch.equal(ours.response_ids, hf.response_ids)
    torch.testing.assert_close(ours.log_probs, hf.log_probs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_sampled_log_probs_match_a_training_forward(tiny, cache):
    tokenizer, model = tiny
    enc = _enc(tokenizer)
    torch.manual_seed(0)
    out = DecodeLoopEngine(max_new_tokens=10, temperature=0.7, cache=cache).generate(
        model, enc.input_ids, enc.attention_mask, tokenizer
    )
    assert model.training  # the mode is restored
    ids = torch.cat([enc.input_ids, out.response_ids], 1)
    attn = torch.cat([enc.attention_mask.bool(), out.response_mask], 1)
    with torch.no_grad():
        fwd = forward_response(model, ids, attn, out.response_ids, temperature=0.7)
    diff = (fwd.log_probs - out.log_probs)[out.response_mask].abs().max()
    assert diff < 1e-4
    assert (out.log_probs[~out.response_mask] == 0).all()
    assert (out.response_ids[~out.response_mask] == tokenizer.pad_token_id).all()


def test_stops_at_eos_and_masks_after_it(tiny):
    tokenizer, model = tiny
    enc = _enc(tokenizer)
    # make EOS the only plausible token: every sequence ends at its first step
    model_eos = load_causal_lm_with_eos_bias(model, tokenizer.eos_token_id)
    out = DecodeLoopEngine(max_new_tokens=8).generate(
        model_eos, enc.input_ids, enc.attention_mask, tokenizer
    )
    assert out.response_ids.shape[1] == 1  # the loop ended early
    assert (out.response_ids[:, 0] == tokenizer.eos_token_id).all()
    assert out.response_mask.all()


def load_causal_lm_with_eos_bias(model, eos_id):
    import copy

    biased = copy.deepcopy(model)
    with torch.no_grad():
        head = biased.get_output_embeddings()
        head.weight.zero_()
        head.weight[eos_id] = 0.0
        if head.bias is None:
            head.bias = torch.nn.Parameter(torch.zeros(head.weight.shape[0]))
        head.bias.fill_(-50.0)
        head.bias[eos_id] = 50.0
    biased.config.tie_word_embeddings = False
    return biased


def test_synced_runs_every_step(tiny):
    tokenizer, model = tiny
    enc = _enc(tokenizer)
    model_eos = load_causal_lm_with_eos_bias(model, tokenizer.eos_token_id)
    out = DecodeLoopEngine(max_new_tokens=5, synced_gpus=True).generate(
        model_eos, enc.input_ids, enc.attention_mask, tokenizer
    )
    assert out.response_ids.shape[1] == 5
    assert out.response_mask.sum(1).tolist() == [1, 1, 1]


def test_top_p_filter_matches_transformers_warper():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen) * 2
    for top_p in (0.3, 0.9, 0.999):
        ours = filter_logits(logits, top_k=0, top_p=top_p)
        theirs = TopPLogitsWarper(top_p)(None, logits.clone())
        assert torch.equal(ours.isinf(), theirs.isinf())


def test_top_k_filter_keeps_k_tokens():
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0, 2.5]])
    kept = ~filter_logits(logits, top_k=2, top_p=1.0).isinf()
    assert kept.tolist() == [[False, True, False, False, True]]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"max_new_tokens": 0},
        {"top_k": -1},
        {"cache": "paged"},
        {"cache": "dynamic", "compile": True},
    ],
)
def test_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        DecodeLoopEngine(**kwargs)


def test_inverse_cdf_sampling_follows_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 1.0, 0.0]])
    draws = torch.cat([sample_categorical(probs) for _ in range(4000)], dim=1)
    freq = torch.stack([(draws[0] == v).float().mean() for v in range(4)])
    # 4000 draws: the standard error of each frequency is below 0.008
    torch.testing.assert_close(freq, probs[0], atol=0.03, rtol=0)
    assert (draws[1] == 2).all()  # a one-hot row always gives its token
    assert not (draws == 1).any()  # a zero-probability token is never drawn


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_decode_equals_eager_and_sees_weight_updates(tiny):
    tokenizer, model = tiny
    enc = _enc(tokenizer)
    eager = DecodeLoopEngine(max_new_tokens=6)
    compiled = DecodeLoopEngine(max_new_tokens=6, compile=True)

    def both():
        args = (model, enc.input_ids, enc.attention_mask, tokenizer)
        return eager.generate(*args, greedy=True), compiled.generate(*args, greedy=True)

    a, b = both()
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=1e-5, rtol=0)
    with torch.no_grad():  # an "optimizer step": the compiled forward must use the new weights
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    c, d = both()
    assert not torch.allclose(a.log_probs, c.log_probs)
    assert torch.equal(c.response_ids, d.response_ids)
    torch.testing.assert_close(c.log_probs, d.log_probs, atol=1e-5, rtol=0)
