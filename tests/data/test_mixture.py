"""MixturePrompts: target proportions, seeded and deterministic tables, task renaming, column
union, and a mid-epoch resume of the data module's loader that continues the same mixture."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from lit_rlhf.data import CountdownPrompts, FilePrompts, MixturePrompts, PromptDataModule

CHAT = str(Path(__file__).parents[2] / "lit_rlhf" / "data" / "samples" / "chat_prompts.jsonl")


def _mixture(seed: int = 0, **kwargs) -> MixturePrompts:  # type: ignore[no-untyped-def]
    sources = [CountdownPrompts(num_examples=10, seed=1),
               FilePrompts(CHAT, answer_field=None, id_field="id", task="chat")]  # fmt: skip
    return MixturePrompts(sources, **{"weights": [2, 1], "num_examples": 30, "seed": seed,
                                      **kwargs})  # fmt: skip


def test_each_source_gets_its_share_and_a_small_source_is_cycled() -> None:
    table = _mixture().load()
    tasks = Counter(table["task"])
    assert tasks == {"countdown": 20, "chat": 10}
    countdown_ids = Counter(q for q, t in zip(table["query_id"], table["task"], strict=True)
                            if t == "countdown")  # fmt: skip
    assert set(countdown_ids.values()) == {2}  # 10 rows, each drawn twice for 20
    chat_ids = [q for q, t in zip(table["query_id"], table["task"], strict=True) if t == "chat"]
    assert len(set(chat_ids)) == 10  # 10 distinct of the 24 chat prompts
    assert table["task"][:15].count("chat") not in (0, 15)  # shuffled, not source by source
    row = next(r for r in table if r["task"] == "chat")
    assert row["numbers"] is None and row["reference"]  # columns of both sources
    assert MixturePrompts([CountdownPrompts(num_examples=3)], num_examples=None).counts([3]) == [3]
    assert _mixture(weights=[1, 1], num_examples=7).counts([10, 24]) in ([4, 3], [3, 4])


def test_the_table_is_seeded_and_tasks_can_be_renamed() -> None:
    first, again, other = _mixture().load(), _mixture().load(), _mixture(seed=1).load()
    assert first["query_id"] == again["query_id"] and first["query_id"] != other["query_id"]
    renamed = _mixture(tasks=["math", "dialogue"]).load()
    assert Counter(renamed["task"]) == {"math": 20, "dialogue": 10}


def test_bad_settings_fail_at_construction() -> None:
    source = CountdownPrompts(num_examples=4)
    with pytest.raises(ValueError, match="positive"):
        MixturePrompts([source, source], weights=[1, 0])
    with pytest.raises(ValueError, match="as many weights"):
        MixturePrompts([source, source], weights=[1])
    with pytest.raises(ValueError, match="at least one"):
        MixturePrompts([])
    with pytest.raises(ValueError, match="fewer than"):
        MixturePrompts([source, source], num_examples=1)


def test_a_resumed_loader_continues_the_same_mixed_order() -> None:
    def module() -> PromptDataModule:
        data = PromptDataModule("builtin:tiny-llama", train=_mixture(), batch_size=4, seed=3)
        data.setup("fit")
        return data

    full = [b["query_id"] for b in module().train_dataloader()]
    loader = module().train_dataloader()
    iterator = iter(loader)
    seen = [next(iterator)["query_id"] for _ in range(3)]
    state = loader.state_dict()
    resumed = module().train_dataloader()
    resumed.load_state_dict(state)
    rest = [b["query_id"] for b in resumed]
    assert seen + rest == full


def test_sequential_schedule_keeps_domain_blocks_and_refuses_shuffling() -> None:
    table = _mixture(schedule="sequential").load()
    assert table["task"] == ["countdown"] * 20 + ["chat"] * 10  # step ranges, source order
    with pytest.raises(ValueError, match="shuffle: false"):
        PromptDataModule("builtin:tiny-llama", train=_mixture(schedule="sequential"))
    data = PromptDataModule("builtin:tiny-llama", train=_mixture(schedule="sequential"),
                            batch_size=10, shuffle=False)  # fmt: skip
    data.setup("fit")
    tasks = [set(b["task"]) for b in data.train_dataloader()]
    assert tasks == [{"countdown"}, {"countdown"}, {"chat"}]
    with pytest.raises(ValueError, match="schedule must be"):
        _mixture(schedule="curriculum")
