"""ScalarRMReward: batched, gradient-free scoring by a saved sequence-classification model, the
row's raw question as the query, and running-mean centring."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_rlhf.models import load_reward_model, load_tokenizer
from lit_rlhf.models.scoring import conversation_text, score_texts
from lit_rlhf.rewards import ScalarRMReward


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny reward model folder (random score head), saved like RewardModelModule exports."""
    folder = tmp_path_factory.mktemp("rm")
    tokenizer = load_tokenizer("builtin:tiny-llama")
    torch.manual_seed(0)
    model = load_reward_model("builtin:tiny-llama", pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _direct(folder: str, queries: list[str], responses: list[str]) -> torch.Tensor:
    tokenizer = load_tokenizer(folder)
    model = load_reward_model(folder, pad_token_id=tokenizer.pad_token_id).eval()
    pairs = zip(queries, responses, strict=True)
    texts = [conversation_text(tokenizer, q, r, chat_template=True) for q, r in pairs]
    with torch.no_grad():
        return score_texts(model, tokenizer, texts, max_length=1024, device=torch.device("cpu"))


def test_scores_match_the_model_in_any_batch_size_and_read_the_question(rm_dir: str) -> None:
    completions = ["one two", "three", "four five six", "seven"]
    rows = [{"question": f"q{i}"} for i in range(3)] + [{}]  # the last falls back to the prompt
    prompts = ["<rendered 0>", "<rendered 1>", "<rendered 2>", "p3"]
    expected = _direct(rm_dir, ["q0", "q1", "q2", "p3"], completions)
    reward = ScalarRMReward(rm_dir, batch_size=3, device="cpu")
    assert reward.model is None  # nothing loads at construction
    out = reward(prompts, completions, rows)
    torch.testing.assert_close(out.scores, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.info["rm_score"], expected, rtol=1e-5, atol=1e-5)
    assert not out.scores.requires_grad
    whole = ScalarRMReward(rm_dir, batch_size=16, device="cpu")(prompts, completions, rows)
    torch.testing.assert_close(whole.scores, out.scores, rtol=1e-5, atol=1e-5)


def test_centring_subtracts_the_running_mean_and_checkpoints_it(rm_dir: str) -> None:
    reward = ScalarRMReward(rm_dir, center=True, device="cpu")
    first = reward(["a", "b"], ["x", "y"], [{}, {}])
    raw1 = first.info["rm_score"]
    torch.testing.assert_close(first.scores, raw1 - raw1.mean())
    second = reward(["c"], ["z"], [{}])
    mean = (raw1.sum() + second.info["rm_score"].sum()) / 3  # all three scores so far
    torch.testing.assert_close(second.scores, second.info["rm_score"] - mean)
    restored = ScalarRMReward(rm_dir, center=True, device="cpu")
    restored.load_state_dict(reward.state_dict())
    assert restored.count == 3 and restored.mean == pytest.approx(float(mean))


def test_bad_settings_are_refused_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch_size >= 1"):
        ScalarRMReward(str(tmp_path), batch_size=0)
    with pytest.raises(ValueError, match="dtype must be"):
        ScalarRMReward(str(tmp_path), dtype="int8")  # type: ignore[arg-type]
    with pytest.raises(OSError, match="could not load"):
        ScalarRMReward(str(tmp_path / "missing"), device="cpu")(["p"], ["c"], [{}])
