"""TextChunks: chunking by tokens (by hand, on a tokenizer whose ids are the words), every input
kind and error, and the prompt data module serving it (padding, refusals, resume); the shipped
text sample."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch

import lit_rlhf.data
from lit_rlhf.data import PromptDataModule, TextChunks, collate_prompts
from lit_rlhf.data.text import chunk_offsets
from lit_rlhf.models import load_tokenizer
from tests.helpers import load_script

SAMPLE = Path(lit_rlhf.data.__file__).parent / "samples" / "text_sample.jsonl"


class NumberTokenizer:
    """Each whitespace-separated word is one token whose id is the number it spells, so chunk
    ids can be checked by hand: ``"0 1 2"`` -> ``[0, 1, 2]``."""

    def __call__(self, texts: Sequence[str], add_special_tokens: bool = True) -> dict[str, Any]:
        assert not add_special_tokens  # chunks are running text, without BOS/EOS
        return {"input_ids": [[int(word) for word in text.split()] for text in texts]}

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))


def numbers(start: int, stop: int) -> str:
    return " ".join(map(str, range(start, stop)))


def write_jsonl(path: Path, texts: Sequence[Any], field: str = "text") -> str:
    path.write_text("".join(json.dumps({field: text}) + "\n" for text in texts))
    return str(path)


def chunks(path: str, **kwargs: Any) -> datasets.Dataset:
    source = TextChunks(path, **kwargs)
    source.bind_tokenizer(NumberTokenizer())
    return source.load()


def test_chunks_by_hand(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "docs.jsonl", [numbers(0, 10), numbers(100, 103)])
    # doc 0 has 10 tokens; a chunk spans 4 + 2 = 6, so chunks start at 0 and 6; the second has a
    # full context (6..9) and no continuation left. Doc 1 (3 tokens) is shorter than a context.
    data = chunks(path, context_tokens=4, continuation_tokens=2)
    assert data["query_id"] == ["text-0:0", "text-0:6"]
    assert data["input_ids"] == [[0, 1, 2, 3], [6, 7, 8, 9]]
    assert data["continuation_ids"] == [[4, 5], []]
    assert data[0]["question"] == data[0]["context"] == "0 1 2 3"
    assert (data[0]["continuation"], data[1]["continuation"]) == ("4 5", "")
    assert set(data["task"]) == {"text"}


def test_stride_overlaps_and_min_context_keeps_the_tail(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "docs.jsonl", [numbers(0, 10)])
    # stride 2 over 10 tokens: starts 0, 2, 4, 6 (6 + 4 = 10); start 8 leaves 2 < 4 tokens
    data = chunks(path, context_tokens=4, stride=2, task="wiki")
    assert data["input_ids"] == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    assert data["query_id"] == ["wiki-0:0", "wiki-0:2", "wiki-0:4", "wiki-0:6"]
    tail = chunks(path, context_tokens=4, stride=2, min_context_tokens=2)
    assert tail["input_ids"][-1] == [8, 9]
    assert chunk_offsets(10, 3, 4) == [0, 3, 6] and chunk_offsets(3, 1, 4) == []


def test_max_chunks_is_a_seeded_draw_in_corpus_order(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "docs.jsonl", [numbers(0, 100)])
    every = chunks(path, context_tokens=2)["query_id"]
    assert len(every) == 50
    first = chunks(path, context_tokens=2, max_chunks=5, seed=0)["query_id"]
    assert chunks(path, context_tokens=2, max_chunks=5, seed=0)["query_id"] == first
    assert chunks(path, context_tokens=2, max_chunks=5, seed=1)["query_id"] != first
    assert set(first) <= set(every) and first == sorted(first, key=every.index)
    assert chunks(path, context_tokens=2, max_chunks=80)["query_id"] == every


def test_input_kinds_txt_jsonl_table_and_folder(tmp_path: Path) -> None:
    txt = tmp_path / "book.txt"
    txt.write_text(f"{numbers(0, 3)}\n\n{numbers(3, 6)}\n")  # one document, blank line and all
    assert chunks(str(txt), context_tokens=6)["input_ids"] == [list(range(6))]
    table = tmp_path / "docs.parquet"
    datasets.Dataset.from_list([{"body": numbers(0, 4)}]).to_parquet(str(table))
    assert chunks(str(table), context_tokens=4, text_field="body")["input_ids"] == [[0, 1, 2, 3]]
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    write_jsonl(folder / "b.jsonl", [numbers(10, 12), numbers(20, 22)])
    (folder / "a.txt").write_text(numbers(0, 2))
    (folder / "c.md").write_text(numbers(30, 32))  # neither .txt nor .jsonl: not read
    (folder / "sub" / "d.txt").write_text(numbers(40, 42))  # subfolders are not read
    data = chunks(str(folder), context_tokens=2)
    assert data["input_ids"] == [[0, 1], [10, 11], [20, 21]]  # files in name order
    assert data["query_id"] == ["text-0:0", "text-1:0", "text-2:0"]


def test_hub_id_goes_to_the_hub_loader_offline() -> None:
    source = TextChunks("someone/no-such-corpus", context_tokens=4)
    source.bind_tokenizer(NumberTokenizer())
    with pytest.raises(OSError, match=r"not a local file or folder.*Hub"):
        source.load()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"context_tokens": 0}, r"context_tokens must be >= 1, got 0\. Fix"),
        ({"continuation_tokens": -1}, r"continuation_tokens must be >= 0.*Fix: 0 for autoenc"),
        ({"stride": 0}, r"stride must be >= 1, got 0\. Fix"),
        ({"min_context_tokens": 5}, r"min_context_tokens must be in \[1, context_tokens=4\]"),
        ({"max_chunks": 0}, "max_chunks must be >= 1 or None"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TextChunks("x.txt", **{"context_tokens": 4, **kwargs})


def test_file_errors_name_the_problem_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothere\.jsonl: no such file.*Fix: check"):
        chunks(str(tmp_path / "nothere.jsonl"))
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        chunks(str(tmp_path / "no_folder"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match=r"empty\.txt: the file is empty\. Fix"):
        chunks(str(empty))
    (tmp_path / "blank.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"blank\.jsonl: the file is empty \(no JSON rows\)"):
        chunks(str(tmp_path / "blank.jsonl"))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match=r"holds no \.txt or \.jsonl files\. Fix"):
        chunks(str(tmp_path / "nothing"))


def test_bad_rows_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"text": "1 2"}) + "\n" + json.dumps({"body": "3"}) + "\n")
    with pytest.raises(
        ValueError,
        match=r"rows\.jsonl, line 2: the row has no field 'text'.*"
        r"\['body'\]\)\. Fix: set text_field=",
    ):
        chunks(str(path))
    write_jsonl(path, ["1 2", 3])
    with pytest.raises(ValueError, match=r"line 2: field 'text' must be a string, got int 3"):
        chunks(str(path))
    path.write_text('{"text": "1"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"line 2: not valid JSON"):
        chunks(str(path))


def test_too_short_documents_and_unbound_tokenizer(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "short.jsonl", [numbers(0, 5), numbers(0, 3)])
    with pytest.raises(
        ValueError,
        match=r"none of the 2 documents.*longest has 5 tokens.*"
        r"Fix: lower context_tokens.*to at most 5",
    ):
        chunks(path, context_tokens=8)
    with pytest.raises(ValueError, match=r"no tokenizer.*Fix:.*bind_tokenizer\(tokenizer\)"):
        TextChunks(path, context_tokens=2).load()


def test_collate_right_pads_continuations_by_hand() -> None:
    rows = [
        {"input_ids": [5], "prompt": "a", "query_id": "q0", "task": "t", "continuation_ids": []},
        {
            "input_ids": [6, 7],
            "prompt": "b",
            "query_id": "q1",
            "task": "t",
            "continuation_ids": [8, 9],
        },
    ]
    batch = collate_prompts(rows, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[0, 5], [6, 7]]  # left
    assert batch["continuation_ids"].tolist() == [[0, 0], [8, 9]]  # right
    assert batch["continuation_mask"].tolist() == [[False, False], [True, True]]
    assert batch["continuation_ids"].dtype == torch.long
    assert batch["continuation_mask"].dtype == torch.bool
    without = collate_prompts(
        [{k: v for k, v in rows[0].items() if k != "continuation_ids"}], pad_token_id=0
    )
    assert "continuation_ids" not in without and "continuation_mask" not in without


@pytest.fixture
def sample_module(tiny_model_dir: str) -> PromptDataModule:
    """The shipped sample in chunks of 16 + 8 tokens; tails down to 4 tokens, so contexts and
    continuations vary in length."""
    source = TextChunks(
        str(SAMPLE),
        context_tokens=16,
        continuation_tokens=8,
        stride=20,
        min_context_tokens=4,
        max_chunks=64,
    )
    module = PromptDataModule(tiny_model_dir, source, batch_size=8, seed=3)
    module.setup("fit")
    return module


def test_data_module_serves_chunks_left_and_right_padded(sample_module: PromptDataModule) -> None:
    module = sample_module
    data = module.train_data
    assert data is not None and len(data) == 64
    by_id = {row["query_id"]: row for row in data}
    lengths = {(len(r["input_ids"]), len(r["continuation_ids"])) for r in data}
    assert len(lengths) > 1  # some tails are shorter: the padding below is exercised
    pad = module.tokenizer.pad_token_id
    for batch in module.train_dataloader():
        ids, mask = batch["input_ids"], batch["attention_mask"]
        cont, cont_mask = batch["continuation_ids"], batch["continuation_mask"]
        assert cont.dtype == torch.long and cont_mask.dtype == torch.bool
        for i, query_id in enumerate(batch["query_id"]):
            row, n, c = by_id[query_id], mask[i].sum(), cont_mask[i].sum()
            assert ids[i, ids.shape[1] - n :].tolist() == row["input_ids"]  # left-padded
            assert (ids[i, : ids.shape[1] - n] == pad).all() and mask[i, -n:].all()
            assert cont[i, :c].tolist() == row["continuation_ids"]  # right-padded
            assert (cont[i, c:] == pad).all() and cont_mask[i, :c].all()
            assert batch["prompt"][i] == row["question"] == row["context"]  # no chat template
            assert "<|user|>" not in batch["prompt"][i]


def test_max_prompt_length_drops_long_contexts(tiny_model_dir: str) -> None:
    source = TextChunks(str(SAMPLE), context_tokens=16, min_context_tokens=4)
    module = PromptDataModule(tiny_model_dir, source, max_prompt_length=15)
    with pytest.warns(UserWarning, match="prompts longer than max_prompt_length=15"):
        module.setup("fit")
    assert module.train_data is not None
    assert all(len(ids) <= 15 for ids in module.train_data["input_ids"])


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"response_prefix": "<answer>"}, "response_prefix ('<answer>')"),
        ({"system_prompt": "Hi."}, "system_prompt ('Hi.')"),
        ({"question_suffix": " /no_think"}, "question_suffix (' /no_think')"),  # not a prefix
        (
            {"system_prompt": "Hi.", "question_suffix": "?"},
            "system_prompt ('Hi.') and question_suffix ('?')",
        ),
    ],
)
def test_prefixes_are_refused_with_a_pretokenized_source(
    tiny_model_dir: str, setting: dict[str, str], named: str
) -> None:
    source = TextChunks(str(SAMPLE), context_tokens=16)
    with pytest.raises(ValueError, match=r"TextChunks is pretokenized.*Fix: remove") as info:
        PromptDataModule(tiny_model_dir, source, **setting)
    assert f"so {named} would not reach the model" in str(info.value)
    assert ("response_prefix" in str(info.value)) == ("response_prefix" in setting)
    with pytest.raises(ValueError, match="pretokenized"):
        PromptDataModule(tiny_model_dir, source, val=source, **setting)


def test_train_loader_resumes_mid_epoch(sample_module: PromptDataModule) -> None:
    loader = sample_module.train_dataloader()
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    expected = next(batches)
    resumed = sample_module.train_dataloader()
    resumed.load_state_dict(state)
    got = next(iter(resumed))
    assert got["query_id"] == expected["query_id"]
    for key in ("input_ids", "attention_mask", "continuation_ids", "continuation_mask"):
        assert torch.equal(got[key], expected[key])


def test_shipped_sample_is_the_generated_one_and_chunks(tiny_model_dir: str) -> None:
    texts = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()]
    assert texts == load_script("data/make_text_sample").make_documents()  # the file as documented
    assert 150 <= len(texts) <= 300
    assert all(60 <= len(text.split()) <= 200 for text in texts)
    tokenizer = load_tokenizer(tiny_model_dir)  # builtin:tiny-llama, as the tiny configs use
    source = TextChunks(str(SAMPLE), context_tokens=64, continuation_tokens=16)
    source.bind_tokenizer(tokenizer)
    data = source.load()
    assert {qid.split(":")[0] for qid in data["query_id"]} == {f"text-{i}" for i in range(200)}
    stream = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert all(tokenizer.decode(ids) == text for ids, text in zip(stream, texts, strict=True))
    for row in data.select(range(0, len(data), 37)):
        doc, offset = map(int, row["query_id"].removeprefix("text-").split(":"))
        # the continuation follows the context in the document's token stream
        expected = stream[doc][offset : offset + 80]
        assert row["input_ids"] + row["continuation_ids"] == expected
        assert len(row["input_ids"]) == 64
