import pytest
import torch

from lit_rlhf.models import load_causal_lm, load_tokenizer
from lit_rlhf.models.forward import forward_response
from lit_rlhf.rollout import DecodeLoopEngine, HFGenerationEngine, response_mask_from_eos


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)


def test_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8]])  # eos id 1
    mask = response_mask_from_eos(ids, 1)
    assert mask.tolist() == [[True, True, False, False], [True, True, True, True]]


def test_engine_log_probs_match_a_training_forward(tiny):
    tokenizer, model = tiny
    enc = tokenizer(["hello there", "Using the numbers"], return_tensors="pt", padding=True)
    engine = HFGenerationEngine(max_new_tokens=10, temperature=0.7)
    torch.manual_seed(0)
    out = engine.generate(model, enc.input_ids, enc.attention_mask, tokenizer)
    assert out.response_ids.shape == out.log_probs.shape == out.response_mask.shape
    assert model.training  # generate restores the mode
    ids = torch.cat([enc.input_ids, out.response_ids], 1)
    attn = torch.cat([enc.attention_mask.bool(), out.response_mask], 1)
    with torch.no_grad():
        fwd = forward_response(model, ids, attn, out.response_ids, temperature=0.7)
    diff = (fwd.log_probs - out.log_probs)[out.response_mask].abs().max()
    assert diff < 1e-4
    assert (out.log_probs[~out.response_mask] == 0).all()


def test_greedy_is_deterministic(tiny):
    tokenizer, model = tiny
    enc = tokenizer(["abc", "Using the numbers [1, 2]"], return_tensors="pt", padding=True)
    engine = HFGenerationEngine(max_new_tokens=8)
    a = engine.generate(model, enc.input_ids, enc.attention_mask, tokenizer, greedy=True)
    b = engine.generate(model, enc.input_ids, enc.attention_mask, tokenizer, greedy=True)
    assert torch.equal(a.response_ids, b.response_ids)


@pytest.mark.parametrize("engine_class", [HFGenerationEngine, DecodeLoopEngine])
def test_log_probs_false_returns_none_and_the_same_tokens(tiny, engine_class):
    tokenizer, model = tiny
    enc = tokenizer(["abc", "Using the numbers [1, 2]"], return_tensors="pt", padding=True)
    engine = engine_class(max_new_tokens=8, temperature=0.7)
    outs = []
    for log_probs in (True, False):
        torch.manual_seed(0)  # the same sampling draws with and without log-probs
        outs.append(
            engine.generate(
                model, enc.input_ids, enc.attention_mask, tokenizer, log_probs=log_probs
            )
        )
    with_lp, without = outs
    assert with_lp.log_probs is not None and without.log_probs is None
    assert torch.equal(with_lp.response_ids, without.response_ids)
    assert torch.equal(with_lp.response_mask, without.response_mask)


@pytest.mark.parametrize("engine_class", [HFGenerationEngine, DecodeLoopEngine])
def test_a_per_call_token_budget_cuts_that_call_only(tiny, engine_class):
    """``generate(max_new_tokens=k)``: at most k tokens, the first k of a full call's with the
    same draws; a budget above the engine's cap is capped; 0 is refused."""
    tokenizer, model = tiny
    enc = tokenizer(["abc", "Using the numbers [1, 2]"], return_tensors="pt", padding=True)
    engine = engine_class(max_new_tokens=8, temperature=0.7)
    outs = {}
    for budget in (None, 3, 50):
        torch.manual_seed(0)
        outs[budget] = engine.generate(
            model, enc.input_ids, enc.attention_mask, tokenizer, max_new_tokens=budget
        )
    full, short = outs[None], outs[3]
    assert full.response_ids.shape[1] == 8 and short.response_ids.shape[1] <= 3
    width = short.response_ids.shape[1]
    assert torch.equal(short.response_ids, full.response_ids[:, :width])
    assert torch.allclose(short.log_probs, full.log_probs[:, :width], atol=1e-5)
    assert torch.equal(outs[50].response_ids, full.response_ids)  # capped at the engine's 8
    with pytest.raises(ValueError, match="must be >= 1"):
        engine.generate(model, enc.input_ids, enc.attention_mask, tokenizer, max_new_tokens=0)


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {"max_new_tokens": 0}, {"top_p": 1.5}])
def test_engine_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        HFGenerationEngine(**kwargs)
