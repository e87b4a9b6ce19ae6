"""FilePrompts' seeded shuffle (``shuffle_seed``): ``max_examples`` then takes a seeded sample of
the split, as the TRE authors' HH data script does (``raw_dataset.shuffle(seed=42)``, then the
first 7,500 rows), instead of the split's first rows. Run on the shipped chat sample, the offline
stand-in of the HH preset's prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from lit_rlhf.data import FilePrompts

REPO = Path(__file__).parents[2]
CHAT = str(REPO / "lit_rlhf/data/samples/chat_prompts.jsonl")
ARGS = {"answer_field": None, "id_field": "id", "task": "chat"}


def _ids(**kwargs) -> list[str]:
    return list(FilePrompts(CHAT, **ARGS, **kwargs).load()["query_id"])


def test_a_seeded_shuffle_picks_the_rows_of_the_seeds_permutation() -> None:
    every = _ids()
    assert len(every) == 24 and every[:2] == ["chat-000", "chat-001"]  # the file's order
    picked = _ids(shuffle_seed=42, max_examples=5)
    # datasets' shuffle(seed=s) is the permutation numpy's default_rng(s) draws: the same rows
    # the authors' `shuffle(seed=42).select(range(n))` takes from a table of this length
    order = np.random.default_rng(42).permutation(len(every))
    assert picked == [every[i] for i in order[:5]]
    assert picked != every[:5]  # a sample, not the first rows
    assert _ids(shuffle_seed=42, max_examples=5) == picked  # the same on every load
    assert _ids(shuffle_seed=7, max_examples=5) != picked  # another seed, another sample
    assert sorted(_ids(shuffle_seed=42)) == sorted(every)  # without max_examples: all rows


def test_the_shuffle_comes_after_where(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "answer": str(i), "keep": i % 2} for i in range(40)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = FilePrompts(str(path), where={"keep": [1]}, shuffle_seed=42, max_examples=6).load()
    odd = [f"q{i}" for i in range(1, 40, 2)]
    order = np.random.default_rng(42).permutation(len(odd))
    assert table["question"] == [odd[i] for i in order[:6]]


@pytest.mark.parametrize("seed", [-1, True, 1.5, "42"])
def test_a_bad_seed_is_refused_with_the_fix(seed) -> None:
    with pytest.raises(ValueError, match=r"shuffle_seed must be an integer >= 0 or null.*Fix:"):
        FilePrompts(CHAT, **ARGS, shuffle_seed=seed)


def test_the_hh_preset_samples_with_the_authors_seed() -> None:
    config = yaml.safe_load((REPO / "configs/ppo/hh_tre_ultrafeedback.yaml").read_text())
    train = config["data"]["init_args"]["train"]["init_args"]
    assert train["shuffle_seed"] == 42 and train["max_examples"] == 7500
