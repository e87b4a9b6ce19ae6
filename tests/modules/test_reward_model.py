"""The Bradley-Terry reward model: the loss and pair rules by hand, a tiny model that learns a
preference on the shared pair DataModule, and the exported folder that transformers loads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from lit_rlhf.data import PreferencePairs, PromptDataModule
from lit_rlhf.models.loading import load_tokenizer
from lit_rlhf.models.scoring import conversation_text
from lit_rlhf.modules import RewardModelModule
from lit_rlhf.modules.reward_model import chosen_and_rejected
from tests.helpers import quiet_trainer


def test_bradley_terry_loss_and_margin_by_hand() -> None:
    module = RewardModelModule(margin=0.5)
    loss = module.bradley_terry(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]))
    # -log sigmoid(2 - 1 - 0.5) = log(1 + e^-0.5); -log sigmoid(-0.5) = log(1 + e^0.5)
    assert loss.tolist() == pytest.approx([math.log1p(math.exp(-0.5)), math.log1p(math.exp(0.5))])


def test_pairs_map_labels_to_chosen_and_refuse_unlabelled() -> None:
    assert chosen_and_rejected([{"label": -1}, {"label": 1}]) == ([1, 2], [2, 1])
    with pytest.raises(
        ValueError, match=r"row 1 \(query 'q7'\) has label=None; a reward model.*keep_ties"
    ):
        chosen_and_rejected([{"label": 1}, {"label": None, "query_id": "q7"}])


def test_settings_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"optim\.lr=-1e-05 must be > 0 and finite"):
        RewardModelModule(optim={"lr": -1e-5})
    with pytest.raises(ValueError, match=r"margin=-1.0 must be >= 0.*model\.init_args\.margin"):
        RewardModelModule(margin=-1.0)
    with pytest.raises(ValueError, match=r"optim\.micro_batch_size=0 must be an integer >= 1"):
        RewardModelModule(optim={"micro_batch_size": 0})
    with pytest.raises(ValueError, match=r"max_length=1 must be >= 2"):
        RewardModelModule(max_length=1)
    with pytest.raises(ValueError, match=r"precision\.reference_dtype='bfloat16': RewardModel"):
        RewardModelModule(precision={"reference_dtype": "bfloat16"})
    with pytest.raises(TypeError, match=r"now optim\.micro_batch_size"):
        RewardModelModule(micro_batch_size=4)  # type: ignore[call-arg]


def test_conversation_text_without_a_chat_template() -> None:
    class Plain:
        chat_template = None

    assert conversation_text(Plain(), "Q?", "A.", chat_template=True) == "Q?\n\nA."


def _pairs_file(path: Path, n: int, offset: int) -> str:
    # the chosen response always says "yes", the rejected "no": learnable by a tiny model
    rows = [
        {"prompt": f"question {i}", "chosen": "yes", "rejected": "no", "id": offset + i}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_tiny_reward_model_learns_a_preference_and_exports(tmp_path: Path) -> None:
    train = PreferencePairs(_pairs_file(tmp_path / "train.jsonl", 96, 0), schema="rewardbench")
    val = PreferencePairs(
        _pairs_file(tmp_path / "val.jsonl", 16, 1000), schema="rewardbench", swap="both"
    )
    data = PromptDataModule(
        "builtin:tiny-llama", train=train, val=val, batch_size=8, val_batch_size=16
    )
    export = tmp_path / "hf"
    torch.manual_seed(0)  # the new score head: independent of what earlier tests drew
    module = RewardModelModule(
        optim={"lr": 1e-3, "micro_batch_size": 4}, max_length=64, export_dir=str(export)
    )

    def validate() -> float:
        return quiet_trainer(tmp_path).validate(module, datamodule=data, verbose=False)[0][
            "val/accuracy"
        ]

    before = validate()
    quiet_trainer(tmp_path, num_sanity_val_steps=0, limit_val_batches=0).fit(module, data)
    after = validate()
    assert after == 1.0 and after > before, (before, after)
    # the exported folder loads back in transformers and scores exactly like the module
    loaded = AutoModelForSequenceClassification.from_pretrained(export).eval()
    tokenizer = AutoTokenizer.from_pretrained(export)
    module.model.eval()
    with torch.no_grad():
        mine = module.score(["question 1", "question 1"], ["yes", "no"])
        text = [
            conversation_text(tokenizer, "question 1", r, chat_template=True) for r in ["yes", "no"]
        ]
        enc = tokenizer(text, return_tensors="pt", padding=True, add_special_tokens=False)
        theirs = loaded(**enc).logits[:, 0]
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    assert mine[0] > mine[1]


def test_gradient_checkpointing_is_applied_and_keeps_the_gradient() -> None:
    """``precision.gradient_checkpointing`` recomputes the blocks in the backward: the loss's
    gradient equals the one without it."""
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        module = RewardModelModule(precision={"gradient_checkpointing": checkpointing})
        module.tokenizer = load_tokenizer("builtin:tiny-llama")
        module.configure_model()
        assert module.model.is_gradient_checkpointing is checkpointing
        module.model.train()
        rewards = module.score(["Q: 2+2?", "Q: 3+3?"], ["4", "six"])
        (rewards[0] - rewards[1]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in module.model.parameters()
                                if p.grad is not None]))  # fmt: skip
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
