"""Supervised fine-tuning data: prompt/response or chat rows -> token ids and labels that train a
causal LM on the response tokens only (the SFT stage of Ouyang et al. 2022, arXiv 2203.02155).

A row is one of (the column names are settings; the encoding is in :mod:`lit_rlhf.data.sft_rows`)

- ``{"prompt": str, "response": str}``, or TRL's ``{"prompt": str, "completion": str}`` (a row
  without ``response`` reads ``completion``): with ``chat_template`` and a tokenizer that has
  one, the prompt is rendered as ``[system?, user: prompt]`` plus the generation prompt (as
  :class:`~lit_rlhf.data.PromptDataModule` renders prompts for generation), and the response
  follows as its own tokens plus the EOS token; without a template, the raw prompt (after
  ``system_prompt`` and a blank line) with the tokenizer's usual special tokens, then the same;
- ``{"messages": [{"role": ..., "content": ...}, ...]}``: a chat rendered by the tokenizer's chat
  template, trained on every assistant turn (its content and the template's end-of-turn text);
  the system, user and any other turns are context only. Each assistant turn is cut out of the
  rendering as the difference between the chat up to it with the generation prompt and the chat
  including it, so the template must render a conversation as a prefix of its continuation;
- TRL's conversational prompt-completion, ``{"prompt": [messages], "completion": [messages]}``:
  the chat ``prompt + completion``, trained on the completion's assistant turns only.

Labels are the token ids on trained tokens and -100 elsewhere (prompt, context turns, padding);
the module shifts them (the token at position t is predicted from the tokens before it). A
sequence longer than ``max_length`` loses its tail; a row whose prompt leaves no response token
within ``max_length`` is an error naming the file, row and fix (or, with ``long_prompts: drop``,
dropped with a count). A batch is::

    input_ids       [b, T] long, right-padded with the pad id
    attention_mask  [b, T] long, 1 on real tokens
    labels          [b, T] long, the trained token ids, -100 elsewhere
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Literal

from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from lit_rlhf.data.prompts import EpochShuffleSampler, epoch_to_train, pad_ids
from lit_rlhf.data.sft_rows import IGNORE, LongPromptError, SFTEncoder
from lit_rlhf.data.sources import _load_table
from lit_rlhf.models import load_tokenizer
from lit_rlhf.settings import DataBatchSettings

LongPrompts = Literal["error", "drop"]
__all__ = [  # the encoder's names are re-exported: imported from here elsewhere
    "IGNORE",
    "LongPromptError",
    "SFTDataModule",
    "SFTEncoder",
    "collate_sft",
]


def collate_sft(
    rows: Sequence[Mapping[str, Sequence[int]]], *, pad_token_id: int
) -> dict[str, Any]:
    """Right-pad encoded rows into a batch (format in the module docstring)."""
    input_ids, mask = pad_ids([row["input_ids"] for row in rows], pad_token_id, "right")
    labels, _ = pad_ids([row["labels"] for row in rows], IGNORE, "right")
    return {"input_ids": input_ids, "attention_mask": mask.long(), "labels": labels}


class SFTDataModule(LightningDataModule):
    """Supervised fine-tuning batches (rows and batch format in the module docstring).

    Args:
        tokenizer: hub id, local folder, or ``builtin:<name>``; loaded here, so the CLI hands
            ``self.tokenizer`` to the model (use the model's own).
        train: the training rows: a local ``.json``/``.jsonl``/``.parquet`` file or folder, or
            a hub dataset id (loaded by ``datasets``; offline, a local file).
        val: the validation rows, the same way (None: no validation).
        batch_size: rows per training batch on each process (the module may split it into
            micro-batches); null: 8, unless ``global_batch_size`` is set.
        val_batch_size: rows per validation batch; None uses the training batch size.
        max_length: tokens per sequence; a longer one loses its tail (counted in a warning).
        seed: the shuffling seed (the order of an epoch depends on seed and epoch only).
        chat_template: render with the tokenizer's chat template when it has one; without,
            prompt/response rows are raw text and chat rows are refused.
        system_prompt: a system message put before every prompt (and before a chat that has
            none).
        num_workers: DataLoader worker processes.
        shuffle: shuffle the training rows every epoch.
        train_split, val_split: the splits of a hub dataset, with optional slicing
            (``"train[:90%]"``); a local file is one split, so only the slice applies to it.
        dataset_name: the hub dataset's configuration name.
        max_examples: keep only the first this many rows of each split.
        prompt_field, response_field, messages_field: the columns holding the prompt, the
            response and the chat; ``response_field=None`` reads ``response``, or
            ``completion`` (TRL's column) in a row without ``response``.
        long_prompts: ``error`` (a row whose prompt leaves no response token within
            ``max_length`` stops the run, naming it) or ``drop`` (such rows are skipped, with a
            count).
        global_batch_size: rows per training batch across all processes, divided by the world
            size in ``setup`` (refused when it does not divide; exclusive with ``batch_size``).
    """

    def __init__(
        self,
        tokenizer: str,
        train: str,
        val: str | None = None,
        batch_size: int | None = None,
        val_batch_size: int | None = None,
        max_length: int = 512,
        seed: int = 0,
        chat_template: bool = True,
        system_prompt: str | None = None,
        num_workers: int = 0,
        shuffle: bool = True,
        train_split: str = "train",
        val_split: str = "test",
        dataset_name: str | None = None,
        max_examples: int | None = None,
        prompt_field: str = "prompt",
        response_field: str | None = None,
        messages_field: str = "messages",
        long_prompts: LongPrompts = "error",
        global_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        size = 1 if batch_size is None else batch_size  # None: set by global_batch_size or 8
        _check_settings(size, val_batch_size, max_length, num_workers, max_examples, long_prompts)
        self.batch = DataBatchSettings(batch_size, global_batch_size)
        self.tokenizer = load_tokenizer(tokenizer)
        self.encoder = SFTEncoder(
            self.tokenizer,
            max_length=max_length,
            chat_template=chat_template,
            system_prompt=system_prompt,
            prompt_field=prompt_field,
            response_field=response_field,
            messages_field=messages_field,
        )
        self.sources = {"train": (train, train_split), "val": (val, val_split)}
        self._val_size = val_batch_size
        self._per_process(1)  # until setup knows the world size
        self.seed, self.shuffle, self.num_workers = seed, shuffle, num_workers
        self.dataset_name, self.max_examples = dataset_name, max_examples
        self.long_prompts = long_prompts
        self.data: dict[str, list[dict[str, list[int]]]] = {}

    def _per_process(self, world_size: int) -> None:
        self.batch_size = self.batch.per_process(world_size)
        self.val_batch_size = self._val_size or self.batch_size

    def setup(self, stage: str | None = None) -> None:
        world = int(getattr(self.trainer, "world_size", 1) or 1) if self.trainer else 1
        self._per_process(world)  # a global batch size divided by the world size
        if stage in (None, "fit") and (line := self.batch.describe(world)):
            rank_zero_info(line)
        splits = ["train", "val"] if stage in (None, "fit") else ["val"]
        for split in splits:
            if split not in self.data and self.sources[split][0] is not None:
                self.data[split] = self.encode_split(split)

    def encode_split(self, split: str) -> list[dict[str, list[int]]]:
        """The encoded rows of ``train`` or ``val`` (errors name the file and row)."""
        path, split_spec = self.sources[split]
        assert path is not None
        table = _load_table(path, self.dataset_name, split_spec)
        if self.max_examples is not None:
            table = table.select(range(min(self.max_examples, len(table))))
        rows, dropped, cut = [], 0, 0
        for index, row in enumerate(table):
            where = f"{path} (split {split_spec!r}), row {index}"
            try:
                encoded = self.encoder.encode(row, where)
            except LongPromptError:
                if self.long_prompts == "error":
                    raise
                dropped += 1
                continue
            cut += encoded["length"][0] > self.encoder.max_length
            rows.append(encoded)
        if not rows:
            raise ValueError(
                f"{path}: no row of split {split_spec!r} is left to train on "
                f"({dropped} dropped by long_prompts: drop). Fix: raise max_length."
            )
        if dropped or cut:
            rank_zero_warn(
                f"{split} ({path}): {dropped} rows dropped (prompt >= max_length="
                f"{self.encoder.max_length}), {cut} of {len(rows)} rows cut to max_length (their "
                "tail is not trained). Fix if unintended: raise data max_length."
            )
        return rows

    def train_dataloader(self) -> DataLoader:
        data = self._require("train")
        epoch = epoch_to_train(self.trainer) if self.trainer is not None else 0
        sampler = (
            EpochShuffleSampler(len(data), seed=self.seed, epoch=epoch) if self.shuffle else None
        )
        return StatefulDataLoader(
            data,  # a list is a map-style dataset
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=partial(collate_sft, pad_token_id=self.tokenizer.pad_token_id),
        )

    def val_dataloader(self) -> DataLoader | list:
        if self.sources["val"][0] is None:
            return []  # Lightning skips validation for an empty list
        return DataLoader(
            self._require("val"),  # type: ignore[arg-type]
            batch_size=self.val_batch_size,
            num_workers=self.num_workers,
            collate_fn=partial(collate_sft, pad_token_id=self.tokenizer.pad_token_id),
        )

    def _require(self, split: str) -> list[dict[str, list[int]]]:
        if split not in self.data:
            raise RuntimeError(f"the {split} rows are not loaded; call setup() first")
        return self.data[split]


def _check_settings(
    batch_size: int,
    val_batch_size: int | None,
    max_length: int,
    num_workers: int,
    max_examples: int | None,
    long_prompts: str,
) -> None:
    rules = [
        ("batch_size", batch_size >= 1, "an integer >= 1"),
        ("val_batch_size", val_batch_size is None or val_batch_size >= 1, ">= 1, or null"),
        ("max_length", max_length >= 2, ">= 2 (a prompt token and a response token)"),
        ("num_workers", num_workers >= 0, ">= 0"),
        ("max_examples", max_examples is None or max_examples >= 1, ">= 1, or null"),
        ("long_prompts", long_prompts in ("error", "drop"), "'error' or 'drop'"),
    ]
    values = dict(
        batch_size=batch_size,
        val_batch_size=val_batch_size,
        max_length=max_length,
        num_workers=num_workers,
        max_examples=max_examples,
        long_prompts=long_prompts,
    )
    for name, ok, allowed in rules:
        if not ok:
            raise ValueError(f"SFTDataModule {name}={values[name]!r}: must be {allowed}. Fix: "
                             f"set data.init_args.{name} to such a value.")  # fmt: skip
