"""Bad data and tokenizers, tried as a new user would (split from test_bad_inputs.py): each must
fail when the object is built, naming the file, row or field and the fix."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lit_rlhf.cli import cli_main
from lit_rlhf.data import (
    CountdownPrompts,
    FilePrompts,
    MixturePrompts,
    PreferencePairs,
    PromptDataModule,
    TextChunks,
)
from lit_rlhf.models import load_tokenizer, resolve
from lit_rlhf.rewards import CountdownReward

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "ppo" / "countdown_tiny.yaml")
REWARD = CountdownReward()


@pytest.fixture(autouse=True)
def _argv_of_the_cli(monkeypatch):
    """``cli_main(args)`` as from the console script (pytest's own argv would be reported)."""
    monkeypatch.setattr("sys.argv", ["lit-rlhf"])


def last_stderr_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[str, str]:
    """Run the CLI on ``args`` expecting a refused configuration; (all of stderr, last line)."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    return err, err.strip().splitlines()[-1]


# ------------------------------------------------------------------------------ data sources
def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl: no such file\. Fix: check the path"):
        FilePrompts(str(tmp_path / "nope.jsonl")).load()


@pytest.mark.parametrize("source", [FilePrompts, PreferencePairs])
def test_empty_file(tmp_path, source):
    path = _write(tmp_path / "empty.jsonl", "")
    with pytest.raises(ValueError, match=r"empty\.jsonl: the file is empty\. Fix: write rows"):
        source(path).load()


def test_blank_lines_only(tmp_path):
    path = _write(tmp_path / "blank.jsonl", "\n  \n")
    with pytest.raises(ValueError, match=r"blank\.jsonl: the file has no rows\. Fix: write rows"):
        FilePrompts(path).load()


def test_malformed_jsonl_row_names_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", '{"question": "a", "answer": "1"}\n{"question": "b",\n')
    with pytest.raises(
        ValueError,
        match=r"bad\.jsonl: line 2 is not valid JSON .*Fix: repair or "
        r"remove that line",
    ):
        FilePrompts(path).load()


def test_empty_prompt_names_row_and_field(tmp_path):
    path = _write(
        tmp_path / "q.jsonl", '{"question": "a", "answer": "1"}\n{"question": " ", "answer": "2"}\n'
    )
    with pytest.raises(
        ValueError,
        match=r"q\.jsonl \(split 'train'\), row 1: field 'question' "
        r"must be a non-empty string.*Fix: repair or remove the row",
    ):
        FilePrompts(path).load()


def test_wrong_question_field(tmp_path):
    path = _write(tmp_path / "q.jsonl", '{"problem": "a", "answer": "1"}\n')
    with pytest.raises(
        ValueError,
        match=r"row 0 has no field 'question'\. Fix: set "
        r"question_field= to one of the columns: \['problem', 'answer'\]",
    ):
        FilePrompts(path).load()


def test_pair_row_without_a_response(tmp_path):
    rows = (
        '{"prompt": "q", "response_1": "a", "response_2": "b", "label": -1}\n'
        '{"prompt": "q", "response_1": "a", "response_2": null, "label": 1}\n'
    )
    with pytest.raises(
        ValueError,
        match=r"p\.jsonl \(split 'train'\), row 1: field 'response_2' "
        r"must be a non-empty string, got missing/None\. Fix: repair or remove the "
        r"row",
    ):
        PreferencePairs(_write(tmp_path / "p.jsonl", rows)).load()


def test_text_chunks_missing_file_and_bad_line(tmp_path):
    tokenizer = load_tokenizer("builtin:tiny-llama")
    missing = TextChunks(str(tmp_path / "nope.txt"))
    missing.bind_tokenizer(tokenizer)
    with pytest.raises(FileNotFoundError, match=r"nope\.txt: no such file or folder\. Fix: check"):
        missing.load()
    bad = TextChunks(_write(tmp_path / "t.jsonl", '{"text": "hello"}\n{"text": \n'))
    bad.bind_tokenizer(tokenizer)
    with pytest.raises(ValueError, match=r"t\.jsonl.*line 2: not valid JSON .*Fix: repair"):
        bad.load()


def test_mixture_and_countdown_settings():
    with pytest.raises(ValueError, match=r"weights must be positive numbers, got \[-1\]\. Fix:"):
        MixturePrompts([CountdownPrompts(num_examples=4)], weights=[-1])
    with pytest.raises(ValueError, match=r"num_numbers must satisfy 2 <= low <= high \(e\.g\. "):
        CountdownPrompts(num_numbers=1)


def test_prompts_all_longer_than_max_prompt_length():
    data = PromptDataModule(
        "builtin:tiny-llama", CountdownPrompts(num_examples=4), max_prompt_length=3
    )
    with pytest.raises(
        ValueError,
        match=r"train: all 4 prompts are longer than "
        r"max_prompt_length=3 tokens\. Fix: raise max_prompt_length",
    ):
        data.setup("fit")


def test_some_prompts_too_long_are_dropped_with_a_warning(tmp_path):
    path = _write(
        tmp_path / "q.jsonl",
        '{"question": "2+2", "answer": "4"}\n'
        f'{{"question": "{"long words " * 200}", "answer": "1"}}\n',
    )
    data = PromptDataModule("builtin:tiny-llama", FilePrompts(path), max_prompt_length=64)
    with pytest.warns(
        UserWarning,
        match=r"train: dropped 1 of 2 prompts longer than "
        r"max_prompt_length=64",
    ):
        data.setup("fit")
    assert data.train_data is not None and len(data.train_data) == 1


def test_ordered_mixture_with_shuffle():
    mixture = MixturePrompts(
        [CountdownPrompts(num_examples=4), CountdownPrompts(seed=1, num_examples=4)],
        schedule="sequential",
    )
    with pytest.raises(ValueError, match=r"shuffle=True would mix it\. Fix: set data shuffle"):
        PromptDataModule("builtin:tiny-llama", mixture)


# -------------------------------------------------------------------------------- tokenizers
def _tokenizer_folder(tmp_path: Path, *, eos: bool) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve("builtin:tiny-llama"))
    tokenizer.pad_token = None
    if not eos:
        tokenizer.eos_token = None
    tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


def test_tokenizer_without_pad_pads_with_eos_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.models.loading"):
        tokenizer = load_tokenizer(_tokenizer_folder(tmp_path, eos=True))
    assert tokenizer.pad_token == tokenizer.eos_token == "<|endoftext|>"
    assert "has no pad token: padding with its EOS token '<|endoftext|>'" in caplog.text


def test_tokenizer_without_pad_or_eos_is_refused(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"has neither a pad nor an EOS token.*Fix: use a "
        r"tokenizer that defines an EOS token",
    ):
        load_tokenizer(_tokenizer_folder(tmp_path, eos=False))
