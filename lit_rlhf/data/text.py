"""Plain text cut into (context, continuation) chunks by tokens: the data of a compressor-decoder
module, which compresses a context into memory vectors and reconstructs it (autoencoding) or
predicts what follows it (continuation); METHODS.md section 5, ICAE arXiv 2307.06945.

:class:`TextChunks` is a prompt source like :class:`~lit_rlhf.data.sources.FilePrompts`, so the
same :class:`~lit_rlhf.data.prompts.PromptDataModule` serves it: it is ``pretokenized`` (the
module keeps its token ids as they are, with no chat template), and it gets the module's
tokenizer through ``bind_tokenizer`` before ``load``.

Documents: a ``.txt`` file is ONE document (the whole file, blank lines included; split a corpus
into files, or into JSONL rows, to get several); each row of a ``.jsonl``/``.json``/``.parquet``/
``.csv`` file or of a hub dataset split is one document (its ``text_field``); a folder holds the
documents of its ``.txt`` and ``.jsonl`` files (not its subfolders), files in sorted name order.
Chunks never cross a document boundary.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from lit_rlhf.data.sources import _load_table
from lit_rlhf.lazy import MYPY, Table, lazy_module

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


_TABLE_SUFFIXES = (".json", ".parquet", ".csv")
_TEXT_COLUMNS = ("query_id", "task", "question", "context", "continuation")
_FOLDER_SUFFIXES = (".txt", ".jsonl")


class TextChunks:
    """Token chunks of plain text: each chunk is ``context_tokens`` tokens of context and the
    (up to) ``continuation_tokens`` tokens that follow it in the same document.

    Documents are tokenized without special tokens (no BOS/EOS: a chunk is a stretch of running
    text; the module adds the markers it needs). Chunk ``j`` of a document starts at token
    ``j * stride``; a chunk whose context would be shorter than ``min_context_tokens`` (the end
    of a document) is dropped; a continuation is cut short by the end of its document (the
    batch's ``continuation_mask`` says which tokens are real).

    Rows: ``query_id`` (``"{task}-{doc}:{offset}"``: document index in load order and token
    offset; stable for the same corpus, tokenizer and chunk settings), ``task``, ``question``
    and ``context`` (the context decoded to text), ``continuation`` (decoded), ``input_ids``
    (list[int], the context ids exactly as chunked: decoding and re-encoding need not give them
    back at a chunk boundary) and ``continuation_ids`` (list[int], possibly empty).

    Args:
        path: a ``.txt``/``.jsonl``/``.json``/``.parquet``/``.csv`` file, a folder of ``.txt``
            and ``.jsonl`` files, or a hub dataset id (``datasets.load_dataset(path, name,
            split=split)``).
        context_tokens: tokens per context (the text to compress).
        continuation_tokens: tokens to predict after the context; 0: autoencoding only.
        stride: tokens between chunk starts; None: ``context_tokens + continuation_tokens``
            (chunks do not overlap). Smaller overlaps chunks, larger skips text.
        min_context_tokens: the shortest context kept; None: ``context_tokens`` (no short tail
            chunks).
        max_chunks: keep this many chunks, drawn by ``seed`` and kept in corpus order; None:
            all.
        seed: seeds the draw of ``max_chunks`` (the same seed gives the same chunks).
        task: the ``task`` of every row.
        text_field: the field holding the text in JSONL/table rows and hub datasets.
        split: the hub split (with slicing, e.g. ``"train[:1000]"``); for a local table file
            only the slice applies.
        name: the hub dataset's configuration name.
    """

    pretokenized = True  # PromptDataModule keeps input_ids as they are

    def __init__(
        self,
        path: str,
        context_tokens: int = 128,
        continuation_tokens: int = 0,
        stride: int | None = None,
        min_context_tokens: int | None = None,
        max_chunks: int | None = None,
        seed: int = 0,
        task: str = "text",
        text_field: str = "text",
        split: str = "train",
        name: str | None = None,
    ) -> None:
        _check_chunking(context_tokens, continuation_tokens, stride, min_context_tokens)
        if max_chunks is not None and max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1 or None (all chunks), got {max_chunks}")
        self.path = path
        self.context_tokens = context_tokens
        self.continuation_tokens = continuation_tokens
        self.stride = stride if stride is not None else context_tokens + continuation_tokens
        self.min_context_tokens = min_context_tokens or context_tokens
        self.max_chunks = max_chunks
        self.seed = seed
        self.task = task
        self.text_field = text_field
        self.split = split
        self.name = name
        self.tokenizer: Any = None

    def bind_tokenizer(self, tokenizer: Any) -> None:
        """Use ``tokenizer`` (a Hugging Face tokenizer) to chunk; ``PromptDataModule`` calls
        this with its own before ``load``."""
        self.tokenizer = tokenizer

    def load(self) -> Table:
        if self.tokenizer is None:
            raise ValueError(
                "TextChunks has no tokenizer to chunk with. Fix: use it as a PromptDataModule "
                "source (the data module binds its tokenizer), or call "
                "source.bind_tokenizer(tokenizer) before load()."
            )
        docs = read_documents(self.path, self.text_field, split=self.split, name=self.name)
        token_docs = self.tokenizer(docs, add_special_tokens=False)["input_ids"]
        chunks = [
            (doc, offset)
            for doc, ids in enumerate(token_docs)
            for offset in chunk_offsets(len(ids), self.stride, self.min_context_tokens)
        ]
        if not chunks:
            longest = max(len(ids) for ids in token_docs)
            raise ValueError(
                f"{self.path}: none of the {len(docs)} documents is long enough for one chunk: "
                f"the longest has {longest} tokens, and a chunk needs min_context_tokens="
                f"{self.min_context_tokens}. Fix: lower context_tokens (or min_context_tokens) "
                f"to at most {longest}, or add longer documents."
            )
        if self.max_chunks is not None and len(chunks) > self.max_chunks:
            drawn = random.Random(self.seed).sample(range(len(chunks)), self.max_chunks)
            chunks = [chunks[i] for i in sorted(drawn)]
        rows = [self._row(token_docs[d], d, o) for d, o in chunks]
        return datasets.Dataset.from_list(rows, features=_row_features())

    def _row(self, ids: list[int], doc: int, offset: int) -> dict[str, Any]:
        end = offset + self.context_tokens
        context = list(ids[offset:end])
        continuation = list(ids[end : end + self.continuation_tokens])
        text = self.tokenizer.decode(context)
        return {
            "query_id": f"{self.task}-{doc}:{offset}",
            "task": self.task,
            "question": text,
            "context": text,
            "continuation": self.tokenizer.decode(continuation),
            "input_ids": context,
            "continuation_ids": continuation,
        }


def chunk_offsets(num_tokens: int, stride: int, min_context_tokens: int) -> list[int]:
    """Start offsets of the chunks of a ``num_tokens``-token document: every ``stride``-th
    token, as long as at least ``min_context_tokens`` tokens remain from it."""
    return list(range(0, max(num_tokens - min_context_tokens + 1, 0), stride))


def read_documents(
    path: str, text_field: str = "text", *, split: str = "train", name: str | None = None
) -> list[str]:
    """The documents at ``path`` (see the module docstring for what one document is)."""
    local = Path(path).expanduser()
    if local.is_dir():
        files = sorted(f for f in local.iterdir() if f.is_file() and f.suffix in _FOLDER_SUFFIXES)
        if not files:
            raise ValueError(
                f"{path}: the folder holds no .txt or .jsonl files. Fix: put the text files "
                "in it (subfolders are not read), or pass a file or hub dataset id as path=."
            )
        return [doc for file in files for doc in _read_file(file, text_field, split)]
    if local.suffix in (*_FOLDER_SUFFIXES, *_TABLE_SUFFIXES) or path.startswith(("/", ".", "~")):
        if not local.exists():
            raise FileNotFoundError(
                f"{path}: no such file or folder. Fix: check the path (relative paths start "
                f"at {Path.cwd()})."
            )
        return _read_file(local, text_field, split)
    table = _load_table(path, name, split)  # a hub dataset id
    return _table_texts(table, text_field, f"{path} (split {split!r})")


def _read_file(file: Path, text_field: str, split: str) -> list[str]:
    if file.suffix == ".txt":
        text = file.read_text(encoding="utf-8")
        if not text.strip():
            raise ValueError(f"{file}: the file is empty. Fix: write text into it or remove it.")
        return [text]
    if file.suffix == ".jsonl":
        return _read_jsonl(file, text_field)
    if file.suffix in _TABLE_SUFFIXES:
        return _table_texts(_load_table(str(file), None, split), text_field, str(file))
    raise ValueError(
        f"{file}: unsupported file type {file.suffix!r}. Fix: use .txt, .jsonl, "
        f"{', '.join(_TABLE_SUFFIXES)}, or a folder of .txt/.jsonl files."
    )


def _read_jsonl(file: Path, text_field: str) -> list[str]:
    """One document per non-blank line; errors name the file and the line (1-based)."""
    docs = []
    for line_number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{file}, line {line_number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err}). Fix: repair the line.") from None
        if not isinstance(row, dict) or text_field not in row:
            fields = list(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(
                f"{where}: the row has no field {text_field!r} (it has {fields}). Fix: set "
                f"text_field= to the field that holds the text, or repair the row."
            )
        docs.append(_text(row[text_field], text_field, where))
    if not docs:
        raise ValueError(f"{file}: the file is empty (no JSON rows). Fix: write rows or remove it.")
    return docs


def _table_texts(table: datasets.Dataset, text_field: str, where: str) -> list[str]:
    if text_field not in table.column_names:
        raise ValueError(
            f"{where}: no column {text_field!r} (columns: {table.column_names}). Fix: set "
            "text_field= to the column that holds the text."
        )
    if len(table) == 0:
        raise ValueError(f"{where}: no rows. Fix: point path= at a file or split with text.")
    return [_text(v, text_field, f"{where}, row {i}") for i, v in enumerate(table[text_field])]


def _text(value: Any, text_field: str, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(
            f"{where}: field {text_field!r} must be a string, got {type(value).__name__} "
            f"{value!r:.60}. Fix: repair or remove the row, or set text_field= to the text field."
        )
    return value


def _check_chunking(
    context_tokens: int, continuation_tokens: int, stride: int | None, min_context: int | None
) -> None:
    if context_tokens < 1:
        raise ValueError(
            f"context_tokens must be >= 1, got {context_tokens}. Fix: set the tokens per context "
            "to compress, e.g. context_tokens: 128."
        )
    if continuation_tokens < 0:
        raise ValueError(
            f"continuation_tokens must be >= 0, got {continuation_tokens}. Fix: 0 for "
            "autoencoding only, or the number of tokens to predict after the context."
        )
    if stride is not None and stride < 1:
        raise ValueError(
            f"stride must be >= 1, got {stride}. Fix: leave it unset (non-overlapping chunks) "
            "or set the tokens between chunk starts."
        )
    if min_context is not None and not 1 <= min_context <= context_tokens:
        raise ValueError(
            f"min_context_tokens must be in [1, context_tokens={context_tokens}], got "
            f"{min_context}. Fix: leave it unset to keep only full contexts."
        )


def _row_features() -> datasets.Features:
    """The chunk rows' columns (built when data loads: ``datasets`` is imported lazily)."""
    ids = datasets.Sequence(datasets.Value("int64"))
    text = {name: datasets.Value("string") for name in _TEXT_COLUMNS}
    return datasets.Features({**text, "input_ids": ids, "continuation_ids": ids})
