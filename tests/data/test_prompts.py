"""PromptDataModule: chat rendering, length filter, left-padded batches, seeded shuffling."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningModule, Trainer

from lit_rlhf.data import CountdownPrompts, FilePrompts, PromptDataModule, collate_prompts
from lit_rlhf.data.prompts import EpochShuffleSampler

QUESTIONS = ["What is 3 + 4?", "Natalia sold 48 clips in April and half as many in May. Total?"]


@pytest.fixture
def gsm8k_file(tmp_path: Path) -> str:
    path = tmp_path / "gsm8k.jsonl"
    rows = [{"question": q, "answer": f"... #### {i}"} for i, q in enumerate(QUESTIONS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def make_module(tiny_model_dir: str, gsm8k_file: str, **kwargs) -> PromptDataModule:
    module = PromptDataModule(tiny_model_dir, FilePrompts(gsm8k_file), **kwargs)
    module.setup("fit")
    return module


def test_collate_left_pads_by_hand() -> None:
    rows = [
        {"input_ids": [5, 6, 7], "prompt": "a", "query_id": "q0", "task": "t", "answer": "1"},
        {"input_ids": [8], "prompt": "b", "query_id": "q1", "task": "t", "answer": "2"},
    ]
    batch = collate_prompts(rows, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch["attention_mask"].tolist() == [[True, True, True], [False, False, True]]
    assert batch["row"][1] == {"prompt": "b", "query_id": "q1", "task": "t", "answer": "2"}


def test_batch_format_left_padding_and_chat_template(tiny_model_dir: str, gsm8k_file: str) -> None:
    module = make_module(tiny_model_dir, gsm8k_file, batch_size=2, shuffle=False)
    batch = next(iter(module.train_dataloader()))
    ids, mask, pad = batch["input_ids"], batch["attention_mask"], module.tokenizer.pad_token_id
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape
    assert torch.equal(mask, ids != pad)
    short = int(mask.sum(1).argmin())
    assert ids[short, 0] == pad and not mask[short, 0] and mask[:, -1].all()
    assert batch["task"] == ["math", "math"] and len(set(batch["query_id"])) == 2
    for i, prompt in enumerate(batch["prompt"]):
        assert prompt == f"<|user|>{QUESTIONS[i]}<|end|>\n<|assistant|>"
        assert module.tokenizer.decode(ids[i][mask[i]]) == prompt
        assert batch["row"][i]["answer"] == f"... #### {i}"
        assert batch["row"][i]["prompt"] == prompt and "input_ids" not in batch["row"][i]


def test_system_prompt_and_raw_prompts(tiny_model_dir: str, gsm8k_file: str) -> None:
    chat = make_module(tiny_model_dir, gsm8k_file, system_prompt="Be brief.", shuffle=False)
    assert chat.train_data is not None
    assert chat.train_data[0]["prompt"].startswith("<|system|>Be brief.<|end|>\n<|user|>")
    raw = make_module(tiny_model_dir, gsm8k_file, use_chat_template=False, shuffle=False)
    assert raw.train_data is not None and raw.train_data["prompt"] == QUESTIONS


def test_long_prompts_are_dropped_with_a_warning(tiny_model_dir: str, tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    rows = [
        {"question": "What is 1 + 1?", "answer": "2"},
        {"question": "The quick brown fox. " * 50, "answer": "0"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.warns(UserWarning, match="dropped 1 of 2 prompts longer than"):
        module = make_module(tiny_model_dir, str(path), max_prompt_length=32)
    assert module.train_data is not None and module.train_data["question"] == [rows[0]["question"]]
    with pytest.raises(ValueError, match="all 2 prompts are longer"):
        make_module(tiny_model_dir, str(path), max_prompt_length=2)


def test_shuffle_is_seeded_per_epoch_and_ids_follow_questions(tiny_model_dir: str) -> None:
    module = PromptDataModule(tiny_model_dir, CountdownPrompts(num_examples=10), batch_size=4)
    module.setup("fit")
    loader = module.train_dataloader()
    sampler = loader.sampler
    assert isinstance(sampler, EpochShuffleSampler)

    def epoch(n: int) -> list[tuple[str, str]]:
        sampler.set_epoch(n)
        return [pair for b in loader for pair in zip(b["query_id"], b["prompt"], strict=True)]

    first, second = epoch(0), epoch(1)
    assert first != second and sorted(first) == sorted(second)  # new order, same id -> prompt
    assert epoch(0) == first  # the order is a function of (seed, epoch)
    assert len({qid for qid, _ in first}) == 10


def test_val_loader_only_with_a_val_source(tiny_model_dir: str, gsm8k_file: str) -> None:
    assert make_module(tiny_model_dir, gsm8k_file).val_dataloader() == []
    module = make_module(
        tiny_model_dir,
        gsm8k_file,
        val=FilePrompts(gsm8k_file, split="train[:1]"),
        val_batch_size=3,
    )
    (batch,) = list(module.val_dataloader())
    assert batch["input_ids"].shape[0] == 1


def test_sources_are_built_from_class_paths(tiny_model_dir: str) -> None:
    parser = ArgumentParser()
    parser.add_class_arguments(PromptDataModule, "data")
    config = parser.parse_object(
        {
            "data": {
                "tokenizer": tiny_model_dir,
                "train": {
                    "class_path": "lit_rlhf.data.CountdownPrompts",
                    "init_args": {"num_examples": 5, "num_numbers": [3, 4]},
                },
                "batch_size": 2,
            }
        }
    )
    module = parser.instantiate_classes(config).data
    assert isinstance(module.train_source, CountdownPrompts)
    module.setup("fit")
    assert module.train_data is not None and len(module.train_data) == 5


class RecordingModule(LightningModule):
    """Records the query ids of each epoch; one parameter so the optimizer has something."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.epochs: dict[int, list[str]] = {}

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.epochs.setdefault(self.current_epoch, []).extend(batch["query_id"])
        return self.weight * batch["attention_mask"].float().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_sets_the_epoch_and_skips_missing_validation(tiny_model_dir: str) -> None:
    data = PromptDataModule(tiny_model_dir, CountdownPrompts(num_examples=6), batch_size=4)
    model = RecordingModule()
    trainer = Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's notes on workers and the empty val list
        trainer.fit(model, data)
    expected = [
        [f"countdown-0-{i}" for i in torch.randperm(6, generator=torch.Generator().manual_seed(e))]
        for e in (0, 1)
    ]
    assert [model.epochs[0], model.epochs[1]] == expected


def test_test_loader_serves_the_test_source(tiny_model_dir: str, gsm8k_file: str) -> None:
    module = PromptDataModule(
        tiny_model_dir,
        FilePrompts(gsm8k_file),
        val=FilePrompts(gsm8k_file, split="train[:1]"),
        test=FilePrompts(gsm8k_file),
        val_batch_size=1,
        test_batch_size=2,
    )
    module.setup("test")
    assert module.train_data is None and module.val_data is None  # only the test prompts load
    (batch,) = list(module.test_dataloader())
    assert batch["input_ids"].shape[0] == 2 and batch["task"] == ["math", "math"]


def test_test_loader_falls_back_to_val(tiny_model_dir: str, gsm8k_file: str) -> None:
    module = PromptDataModule(
        tiny_model_dir,
        CountdownPrompts(num_examples=4),
        val=FilePrompts(gsm8k_file),
        batch_size=4,
        val_batch_size=1,
    )
    assert module.test_batch_size == 1  # None follows val_batch_size
    module.setup("test")
    assert module.train_data is None
    batches = list(module.test_dataloader())
    assert [row["question"] for batch in batches for row in batch["row"]] == QUESTIONS


def test_test_loader_without_test_or_val_says_the_fix(tiny_model_dir: str) -> None:
    module = PromptDataModule(tiny_model_dir, CountdownPrompts(num_examples=4))
    module.setup("test")
    with pytest.raises(ValueError, match=r"neither a `test` nor a `val`.*data\.init_args\.test"):
        module.test_dataloader()
    with pytest.raises(ValueError, match="test_batch_size must be >= 1"):
        PromptDataModule(tiny_model_dir, CountdownPrompts(num_examples=4), test_batch_size=0)


class EvaluatedIdsModule(LightningModule):
    """Records the query ids ``trainer.test`` feeds it."""

    def __init__(self) -> None:
        super().__init__()
        self.tested: list[str] = []

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.tested.extend(batch["query_id"])


def test_trainer_test_runs_on_the_test_prompts(tiny_model_dir: str) -> None:
    data = PromptDataModule(
        tiny_model_dir,
        CountdownPrompts(num_examples=6),
        test=CountdownPrompts(num_examples=3, seed=7),
        batch_size=4,
    )
    model = EvaluatedIdsModule()
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's note on DataLoader workers
        trainer.test(model, data)
    assert model.tested == [f"countdown-7-{i}" for i in range(3)]  # in order, not shuffled
