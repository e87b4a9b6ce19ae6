"""Prompt sources: where the questions of a prompt data module come from.

A source is any object with ``load() -> datasets.Dataset``; the rows have at least

- ``query_id`` (str): stable id of the prompt, the same across loads, epochs and shuffles,
- ``task`` (str): the domain label rewards and logs group by (``"countdown"``, ``"math"``),
- ``question`` (str): the user message,

plus the metadata the rewards read (``numbers``/``target`` for Countdown, ``answer`` for math).
Sources are plain classes with typed keyword arguments, so YAML configs build them by
``class_path``. File rows are validated before use: a bad row fails early with its file, row
index, field, and a fix, rather than as a ``KeyError`` in a reward mid-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lit_rlhf.data.countdown import countdown_question, generate_countdown
from lit_rlhf.lazy import MYPY, Table, lazy_module

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


@runtime_checkable
class PromptSource(Protocol):
    """Anything that yields a prompt table with ``query_id``, ``task`` and ``question`` columns.

    Two optional hooks, read by :class:`~lit_rlhf.data.prompts.PromptDataModule`:

    - ``bind_tokenizer(tokenizer)``: called with the data module's tokenizer before ``load()``,
      for a source that needs one (``TextChunks`` chunks text by tokens);
    - ``pretokenized = True``: the rows carry ``input_ids`` (list[int]) that the data module
      keeps as they are, with no chat template; ``system_prompt`` and ``response_prefix`` are
      refused for such a source.
    """

    def load(self) -> Table: ...


class CountdownPrompts:
    """Procedural Countdown tasks (TinyZero; see :mod:`lit_rlhf.data.countdown`).

    Rows: ``query_id``, ``task="countdown"``, ``question``, ``numbers`` (list[int]),
    ``target`` (int), ``solution`` (str, one expression reaching the target).

    Difficulty knobs: ``num_numbers``, the value ranges, and ``operators`` (the operators the
    hidden solution uses; the reward accepts any of + - * /). ``question_template`` replaces the
    default wording (``str.format`` over ``{numbers}`` and ``{target}``).
    """

    def __init__(
        self,
        num_examples: int = 1000,
        seed: int = 0,
        num_numbers: int | tuple[int, int] = (3, 4),
        min_value: int = 1,
        max_value: int = 99,
        max_target: int = 999,
        operators: str = "+-*/",
        question_template: str | None = None,
    ) -> None:
        self.kwargs: dict[str, Any] = dict(
            seed=seed,
            num_numbers=num_numbers,
            min_value=min_value,
            max_value=max_value,
            max_target=max_target,
            operators=operators,
        )
        if question_template is not None:
            try:
                question_template.format(numbers="1, 2", target=3)
            except (KeyError, IndexError, ValueError) as err:
                raise ValueError(
                    f"question_template {question_template!r} is not a valid template ({err}); "
                    "it may use only {numbers} and {target}; write literal braces as {{ }}"
                ) from None
        self.question_template = question_template
        self.num_examples = num_examples
        generate_countdown(0, **self.kwargs)  # validates the arguments now, at config time
        if num_examples < 1:
            raise ValueError(f"num_examples must be >= 1, got {num_examples}")

    def load(self) -> Table:
        rows = generate_countdown(self.num_examples, **self.kwargs)
        return datasets.Dataset.from_list(
            [
                {
                    **row,
                    "query_id": str(row["query_id"]),
                    "task": "countdown",
                    "question": countdown_question(row, self.question_template),
                }
                for row in rows
            ]
        )


class FilePrompts:
    """Questions from a local file/folder or a Hugging Face Hub dataset.

    Args:
        path: a local ``.json``/``.jsonl``/``.parquet``/``.csv`` file, a local folder of such
            files, or a hub dataset id (e.g. ``openai/gsm8k``).
        split: split with optional slicing, e.g. ``"train[:90%]"``. A single local file is one
            split, so only the slice of this argument applies to it.
        question_field: the column holding the question; ``None`` reads ``prompt`` (TRL's prompt
            column) where the rows have one, else ``question``.
        answer_field: the column copied to ``answer`` (as str) for reward checks; ``None`` for
            none. A named column the rows lack is an error, except the default ``answer``:
            rows without an ``answer`` column get none.
        id_field: the column used as ``query_id``; ``None`` derives it from the question:
            ``"{task}-{sha1(question)[:12]}"``.
        task: the task label of every row.
        name: the hub dataset's configuration name (``"main"`` for gsm8k).
        max_examples: keep only the first this many rows of the split.
        question_template: ``str.format`` template over the row's fields, where ``{question}``
            is the ``question_field`` value, e.g.
            ``"{problem}\\nPut the final answer in \\\\boxed{{}}."``.
        where: keep only the rows whose column holds one of the listed values, e.g.
            ``{level: [Level 3, Level 4, Level 5]}`` (MATH's hardest levels, as SimpleRL);
            applied before ``max_examples``.
        shuffle_seed: shuffle the rows with this seed (``datasets.Dataset.shuffle(seed=...)``)
            after ``where`` and before ``max_examples``, so that ``max_examples`` takes a seeded
            sample rather than the split's first rows; ``None`` keeps the file's order.

    The other columns of the file are kept in the rows, for rewards that read them. A question
    column in chat format (a list of ``{role, content}`` messages, as verl's parquet files store
    prompts) is read as its single user message, and holds that text in the rows.
    """

    def __init__(
        self,
        path: str,
        split: str = "train",
        question_field: str | None = None,
        answer_field: str | None = "answer",
        id_field: str | None = None,
        task: str = "math",
        name: str | None = None,
        max_examples: int | None = None,
        question_template: str = "{question}",
        where: dict[str, list[Any]] | None = None,
        shuffle_seed: int | None = None,
    ) -> None:
        if max_examples is not None and max_examples < 1:
            raise ValueError(f"max_examples must be >= 1 or None, got {max_examples}")
        if shuffle_seed is not None and (
            isinstance(shuffle_seed, bool) or not isinstance(shuffle_seed, int) or shuffle_seed < 0
        ):
            raise ValueError(
                f"shuffle_seed must be an integer >= 0 or null, got {shuffle_seed!r}. Fix: set "
                "shuffle_seed: 42 (a seeded sample), or null to keep the file's order."
            )
        self.shuffle_seed = shuffle_seed
        _check_template(question_template)
        self.path = path
        self.split = split
        self.question_field = question_field
        self.answer_field = answer_field
        self.id_field = id_field
        self.task = task
        self.name = name
        self.max_examples = max_examples
        self.question_template = question_template
        if where is not None and not all(isinstance(v, list) and v for v in where.values()):
            raise ValueError(
                f"where must map column names to non-empty lists of values, got {where!r}"
            )
        self.where = dict(where or {})

    def load(self) -> Table:
        raw = self._filter(self._load_raw())
        if self.shuffle_seed is not None:
            raw = raw.shuffle(seed=self.shuffle_seed)
        if self.max_examples is not None:
            raw = raw.select(range(min(self.max_examples, len(raw))))
        fields = self._check_columns(raw.column_names)
        rows = [self._prompt_row(index, dict(row), *fields) for index, row in enumerate(raw)]
        duplicates = sum(n - 1 for n in Counter(r["query_id"] for r in rows).values())
        if duplicates:
            warnings.warn(
                f"{self.path}: {duplicates} rows repeat an earlier query_id (same question or "
                f"id_field value); they share per-prompt statistics",
                stacklevel=2,
            )
        return datasets.Dataset.from_list(rows)

    def _load_raw(self) -> datasets.Dataset:
        return _load_table(self.path, self.name, self.split)

    def _filter(self, raw: datasets.Dataset) -> datasets.Dataset:
        """The rows that pass ``where`` (all of them without it)."""
        if not self.where:
            return raw
        missing = [c for c in self.where if c not in raw.column_names]
        if missing:
            raise ValueError(
                f"{self.path}: where names columns {missing} the rows lack (columns: "
                f"{raw.column_names}). Fix: name existing columns in where."
            )
        keep = [i for i, row in enumerate(raw)
                if all(row[c] in values for c, values in self.where.items())]  # fmt: skip
        if not keep:
            raise ValueError(f"{self.path}: no row passes where={self.where!r}")
        return raw.select(keep)

    def _question_column(self, columns: list[str]) -> str:
        """``question_field``, or (when ``None``) ``prompt`` where the rows have it, else
        ``question``."""
        if self.question_field is not None:
            return self.question_field
        found = [column for column in ("prompt", "question") if column in columns]
        if not found:
            raise ValueError(
                f"{self.path}: question_field is null (read 'prompt', TRL's column, else "
                f"'question'); the rows have no 'prompt' column, and row 0 has no field "
                f"'question'. Fix: set question_field= to one of the columns: {columns}."
            )
        return found[0]

    def _check_columns(self, columns: list[str]) -> tuple[str, str | None]:
        """The question and answer columns to read (after the defaults' detection); a named
        column the rows lack is an error."""
        question_field = self._question_column(columns)
        answer_field = self.answer_field
        if answer_field == "answer" and "answer" not in columns:
            answer_field = None  # the default is optional: such rows carry no answer
        for arg, field in (
            ("question_field", question_field),
            ("answer_field", answer_field),
            ("id_field", self.id_field),
        ):
            if field is not None and field not in columns:
                fix = f"set {arg}= to one of the columns: {columns}"
                if arg != "question_field":
                    fix += f", or {arg}=null"
                raise ValueError(f"{self.path}: row 0 has no field {field!r}. Fix: {fix}.")
        return question_field, answer_field

    def _prompt_row(
        self, index: int, row: dict[str, Any], field: str, answer_field: str | None
    ) -> dict[str, Any]:
        where = f"{self.path} (split {self.split!r}), row {index}"
        question = _user_message(row[field], where, field)
        row = {**row, field: question}  # a chat column becomes its text
        if not isinstance(question, str) or not question.strip():
            got = "missing/None" if question is None else f"{type(question).__name__} {question!r}"
            raise ValueError(
                f"{where}: field {field!r} must be a non-empty string, got "
                f"{got:.100}. Fix: repair or remove the row, or set question_field= to the "
                f"column holding the question text (columns: {list(row)})."
            )
        try:
            rendered = self.question_template.format(**{**row, "question": question})
        except KeyError as err:
            raise ValueError(
                f"{where}: question_template refers to field {err}, which the row lacks. "
                f"Fix: use only the columns {list(row)} (and {{question}}) in the template."
            ) from None
        out = {**row, "question": rendered, "task": self.task}
        if answer_field is not None:
            out["answer"] = str(self._required(where, row, answer_field, "answer_field"))
        if self.id_field is not None:
            out["query_id"] = str(self._required(where, row, self.id_field, "id_field"))
        else:
            out["query_id"] = f"{self.task}-{hashlib.sha1(rendered.encode()).hexdigest()[:12]}"
        return out

    @staticmethod
    def _required(where: str, row: dict[str, Any], field: str, arg: str) -> Any:
        value = row[field]
        if value is None or value == "":
            raise ValueError(
                f"{where}: field {field!r} ({arg}) is missing or empty. Fix: repair or remove "
                f"the row, or set {arg}=null to go without it."
            )
        return value


def _user_message(value: Any, where: str, field: str) -> Any:
    """A chat-format question (a list of ``{role, content}`` messages) as its one user message;
    any other value as it is (checked by the caller)."""
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        return value
    users = [m.get("content") for m in value if m.get("role") == "user"]
    if len(users) != 1 or any(m.get("role") not in ("user", "system") for m in value):
        raise ValueError(
            f"{where}: field {field!r} is a chat with {len(users)} user messages; a prompt "
            "source reads one user message. Fix: keep single-turn rows only."
        )
    return users[0]


def _check_template(template: str) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise ValueError(
            f"question_template {template!r} is not a valid str.format template: {err}. "
            "Fix: write literal braces as {{ and }}, e.g. '\\\\boxed{{}}'."
        ) from None
    if any(f == "" or f.isdigit() for f in fields):
        raise ValueError(
            f"question_template {template!r} has a positional field ({{}} or {{0}}). Fix: name "
            "the fields after the row's columns, e.g. '{question}', and write literal braces "
            "as {{ and }}."
        )


def _load_table(path: str, name: str | None, split: str) -> datasets.Dataset:
    """A split of a local file/folder or a hub dataset (``name``: its configuration), with
    errors that say how to fix a missing file or an unreachable hub."""
    local = Path(path).expanduser()
    if local.is_dir():
        return datasets.load_dataset(str(local), name, split=split)
    if local.suffix in _FILE_BUILDERS:
        if not local.is_file():
            raise FileNotFoundError(
                f"{path}: no such file. Fix: check the path (relative paths start at "
                f"{os.getcwd()})."
            )
        if local.stat().st_size == 0:
            raise ValueError(f"{path}: the file is empty. Fix: write rows into it, or remove it.")
        split_name = split.split("[", 1)[0]  # one file = one split; keep the slice
        try:
            return datasets.load_dataset(
                _FILE_BUILDERS[local.suffix],
                data_files={split_name: str(local)},
                split=split,
            )
        except Exception as err:  # the reader's own message names neither file nor line
            problem = _json_lines_problem(local) if local.suffix == ".jsonl" else None
            if problem is None:
                raise
            raise ValueError(f"{path}: {problem}.") from err
    try:
        return datasets.load_dataset(path, name, split=split)
    except OSError as err:  # ConnectionError and DatasetNotFoundError are both OSErrors
        raise OSError(
            f"could not load {path!r}: it is not a local file or folder, and loading it "
            f"from the Hugging Face Hub failed (offline or unreachable, or no such dataset; "
            f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}): {err}. Fix: download "
            f"it where the hub is reachable, e.g. `datasets.load_dataset({path!r}, "
            f"{name!r}, split={split!r}).to_json('prompts.jsonl')`, and pass the "
            f"local file as path= (supported: {', '.join(_FILE_BUILDERS)} or a folder)."
        ) from err


def _json_lines_problem(file: Path) -> str | None:
    """The first line of a JSON-lines file that is not a JSON object (or that it has no rows),
    with the fix; None when every line is one (the failure was something else)."""
    fix = "Fix: repair or remove that line"
    rows = 0
    with file.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                return f"line {number} is not valid JSON ({err.msg} at column {err.colno}). {fix}"
            if not isinstance(value, dict):
                return f"line {number} is a JSON {type(value).__name__}, not an object. {fix}"
            rows += 1
    return None if rows else "the file has no rows. Fix: write rows into it, or remove it"
