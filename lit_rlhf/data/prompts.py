"""The prompt data module shared by the RL modules: sources -> chat-rendered, tokenized,
left-padded prompt batches.

A batch is a dict::

    input_ids       [b, P] long, left-padded with the tokenizer's pad id
    attention_mask  [b, P] bool, True on prompt tokens
    prompt          [b] str, the rendered prompt text (chat template applied)
    query_id        [b] str, stable prompt id
    task            [b] str
    row             [b] dict, the full data row (question, prompt, answer/numbers/target, ...)

and, when the rows have ``continuation_ids`` (``TextChunks``: the tokens after a context),

    continuation_ids   [b, C] long, right-padded with the pad id
    continuation_mask  [b, C] bool, True on continuation tokens

A ``pretokenized`` source (``TextChunks``) brings its own ``input_ids``: they are kept as they are
(no chat template, system prompt or response prefix), and ``prompt`` is its ``question``.

Shuffling is seeded by ``seed`` and the epoch, so the order of an epoch does not depend on how
many epochs ran before it in this process. The training loader is torchdata's
``StatefulDataLoader``: Lightning stores its position in every checkpoint, so a run resumed from a
mid-epoch checkpoint continues with the next unseen batch of that epoch (with a plain
``DataLoader`` it would restart the epoch and train on its first batches twice).

The rendering, tokenizing and collating of prompts live in :mod:`lit_rlhf.data.prompt_batches`,
the epoch-seeded sampler in :mod:`lit_rlhf.data.epoch_sampler`; both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

from lit_rlhf.data.epoch_sampler import EpochShuffleSampler, epoch_to_train
from lit_rlhf.data.prompt_batches import (
    collate_prompts,
    pad_ids,
    render_chat_prompt,
    tokenize_prompts,
)
from lit_rlhf.data.sources import PromptSource
from lit_rlhf.errors import DataError
from lit_rlhf.lazy import MYPY, lazy_module
from lit_rlhf.models import load_tokenizer
from lit_rlhf.settings import DataBatchSettings

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


__all__ = [  # the batch helpers and the sampler are re-exported: imported from here elsewhere
    "EpochShuffleSampler",
    "PromptDataModule",
    "collate_prompts",
    "epoch_to_train",
    "pad_ids",
    "render_chat_prompt",
    "tokenize_prompts",
]

_REQUIRED_COLUMNS = ("query_id", "task", "question")


class PromptDataModule(LightningDataModule):
    """Prompt batches for generation.

    Args:
        tokenizer: hub id, local folder, or ``builtin:<name>``; loaded here, so the CLI can hand
            ``self.tokenizer`` to the model.
        train: the training prompt source, e.g. ``CountdownPrompts`` or ``FilePrompts``.
        val: an optional validation prompt source.
        test: an optional test prompt source (``lit-rlhf test`` and ``predict``); ``None``
            tests on ``val``.
            With neither, ``test_dataloader`` raises.
        batch_size: prompts (a pair source: pairs) per training batch on each process (before
            sampling G responses each); null: 8, unless ``global_batch_size`` is set.
        global_batch_size: prompts (pairs) per training batch across all processes, divided
            by the world size in ``setup`` (refused when it does not divide; exclusive with
            ``batch_size``, which holds the per-process size after ``setup``).
        val_batch_size: prompts per validation batch (per process); ``None`` uses the training
            batch size.
        test_batch_size: prompts per test batch; ``None`` uses the validation batch size.
        max_prompt_length: prompts longer than this many tokens are dropped (with a warning).
        system_prompt: a system message put before each question. Refused with a
            ``pretokenized`` source, whose token ids are used as they are.
        use_chat_template: render prompts with the tokenizer's chat template (and open the
            assistant turn). Without it, or when the tokenizer has none, the prompt is the raw
            question, preceded by ``system_prompt`` and a blank line if one is given. Not
            applied to a ``pretokenized`` source's rows.
        response_prefix: text that opens the response, appended to every rendered prompt (an
            assistant pre-fill such as ``"<answer>"``); rewards see it at the end of the prompt.
            ``{subject}`` in it is replaced by each row's ``subject`` column (pair sources:
            ``Response``, or ``Critique`` on ReflectRM's reflection rows). Refused with a
            ``pretokenized`` source.
        chat_template_kwargs: extra arguments of the tokenizer's ``apply_chat_template``, e.g.
            ``{enable_thinking: false}`` to switch Qwen3's thinking mode off (its template then
            pre-fills an empty think block).
        question_suffix: text appended to every user message, e.g. ``" /no_think"`` (Qwen3's
            soft switch, appended by ReflectRM, arXiv 2604.07506).
        shuffle: shuffle the training prompts every epoch.
        seed: the shuffling seed.
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        tokenizer: str,
        train: PromptSource,
        val: PromptSource | None = None,
        test: PromptSource | None = None,
        batch_size: int | None = None,
        val_batch_size: int | None = None,
        test_batch_size: int | None = None,
        max_prompt_length: int = 512,
        system_prompt: str | None = None,
        use_chat_template: bool = True,
        response_prefix: str = "",
        chat_template_kwargs: dict[str, Any] | None = None,
        question_suffix: str = "",
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        global_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        size = 1 if batch_size is None else batch_size  # None: set by global_batch_size or 8
        _check_sizes(size, val_batch_size, test_batch_size, max_prompt_length, num_workers)
        self.batch = DataBatchSettings(batch_size, global_batch_size)
        if shuffle and getattr(train, "ordered", False):
            raise ValueError(
                f"the train source ({type(train).__name__}) has an order that matters (e.g. "
                "MixturePrompts(schedule='sequential'): domain blocks by step ranges), and "
                "shuffle=True would mix it. Fix: set data shuffle: false."
            )
        texts = {"system_prompt": system_prompt, "response_prefix": response_prefix,
                 "question_suffix": question_suffix}  # fmt: skip
        _check_pretokenized((train, val, test), texts)
        self.tokenizer = load_tokenizer(tokenizer)
        self.train_source = train
        self.val_source = val
        self.test_source = test
        self._eval_sizes = (val_batch_size, test_batch_size)
        self._per_process(1)  # until setup knows the world size
        self.max_prompt_length = max_prompt_length
        self.system_prompt = system_prompt
        self.use_chat_template = use_chat_template and bool(
            getattr(self.tokenizer, "chat_template", None)
        )
        self.response_prefix = response_prefix
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.question_suffix = question_suffix
        self.shuffle = shuffle
        self.seed = seed
        self.num_workers = num_workers
        self.train_data: datasets.Dataset | None = None
        self.val_data: datasets.Dataset | None = None
        self.test_data: datasets.Dataset | None = None
        self.longest_prompt = 0  # tokens of the longest prompt kept in any prepared split

    def _per_process(self, world_size: int) -> None:
        self.batch_size = self.batch.per_process(world_size)
        val, test = self._eval_sizes
        self.val_batch_size = val or self.batch_size
        self.test_batch_size = test or self.val_batch_size

    def setup(self, stage: str | None = None) -> None:
        world = int(getattr(self.trainer, "world_size", 1) or 1) if self.trainer else 1
        self._per_process(world)  # a global batch size divided by the world size
        if stage in (None, "fit") and (line := self.batch.describe(world)):
            rank_zero_info(line)
        if self.train_data is None and stage in (None, "fit"):
            self.train_data = self._prepare(self.train_source, "train")
        # without a test source, testing (and predicting) runs on the validation prompts
        evaluates = stage in (None, "test", "predict")
        needs_val = stage in (None, "fit", "validate") or (evaluates and self.test_source is None)
        if self.val_data is None and self.val_source is not None and needs_val:
            self.val_data = self._prepare(self.val_source, "val")
        if self.test_data is None and self.test_source is not None and evaluates:
            self.test_data = self._prepare(self.test_source, "test")

    def render_prompt(self, question: str, subject: str | None = None) -> str:
        """The prompt text the model sees for one question (``subject`` fills ``{subject}`` in
        the response prefix)."""
        prefix = self.response_prefix
        if "{subject}" in prefix:
            if subject is None:
                raise ValueError(
                    f"response_prefix {prefix!r} names {{subject}}, and the rows have no subject "
                    "column. Fix: use a pair source (its rows say Response or Critique), or "
                    "write the subject into the prefix."
                )
            prefix = prefix.replace("{subject}", subject)
        return render_chat_prompt(
            self.tokenizer,
            question,
            system_prompt=self.system_prompt,
            use_chat_template=self.use_chat_template,
            response_prefix=prefix,
            chat_template_kwargs=self.chat_template_kwargs,
            question_suffix=self.question_suffix,
        )

    def train_dataloader(self) -> DataLoader:
        data = self._require(self.train_data, "train")
        # the epoch a resumed run is in: Lightning makes the (resumed) iterator before it calls
        # set_epoch, so a sampler left at epoch 0 would replay epoch 0's order
        epoch = epoch_to_train(self.trainer) if self.trainer is not None else 0
        sampler = (
            EpochShuffleSampler(len(data), seed=self.seed, epoch=epoch) if self.shuffle else None
        )
        return self._loader(data, self.batch_size, sampler, resumable=True)

    def val_dataloader(self) -> DataLoader | list:
        if self.val_source is None:
            return []  # Lightning skips validation for an empty list
        return self._loader(self._require(self.val_data, "val"), self.val_batch_size, None)

    def test_dataloader(self) -> DataLoader:
        """The test prompts, or the validation prompts when no test source is set."""
        if self.test_source is not None:
            data = self._require(self.test_data, "test")
        elif self.val_source is not None:
            data = self._require(self.val_data, "val")
        else:
            raise ValueError(
                "PromptDataModule has no test prompts: it was given neither a `test` nor a `val` "
                "source. Fix: set data.init_args.test (or data.init_args.val) to a prompt "
                "source, e.g. {class_path: lit_rlhf.data.CountdownPrompts, init_args: {seed: 1}}"
            )
        return self._loader(data, self.test_batch_size, None)

    def predict_dataloader(self) -> DataLoader:
        """``lit-rlhf predict`` and ``Trainer.predict`` run on the test prompts (see above)."""
        return self.test_dataloader()

    def _loader(
        self,
        data: datasets.Dataset,
        batch_size: int,
        sampler: Sampler[int] | None,
        resumable: bool = False,
    ) -> DataLoader:
        loader_class = StatefulDataLoader if resumable else DataLoader
        return loader_class(
            data,  # map-style: __len__ and (batched) __getitems__
            batch_size=batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=partial(collate_prompts, pad_token_id=self.tokenizer.pad_token_id),
        )

    def _prepare(self, source: PromptSource, split: str) -> datasets.Dataset:
        bind_tokenizer = getattr(source, "bind_tokenizer", None)
        if callable(bind_tokenizer):
            bind_tokenizer(self.tokenizer)
        try:
            data = source.load()
        except ValueError as err:  # the source names the file, the row and the fix
            if isinstance(err, DataError):
                raise
            raise DataError(str(err), setting=f"data.init_args.{split}") from err
        pretokenized = getattr(source, "pretokenized", False)
        required = (*_REQUIRED_COLUMNS, "input_ids") if pretokenized else _REQUIRED_COLUMNS
        missing = [c for c in required if c not in data.column_names]
        if missing:
            raise ValueError(
                f"{type(source).__name__}.load() returned no {missing} column(s) (has "
                f"{data.column_names}); a prompt source must provide {list(required)}"
            )
        if pretokenized:
            prompts, ids = list(data["question"]), list(data["input_ids"])
        else:
            prompts, ids = self._render_and_tokenize(data)
        keep = [i for i, x in enumerate(ids) if len(x) <= self.max_prompt_length]
        dropped = len(ids) - len(keep)
        if not keep:
            raise DataError(
                f"{split}: all {len(ids)} prompts are longer than max_prompt_length="
                f"{self.max_prompt_length} tokens. Fix: raise max_prompt_length.",
                setting="data.init_args.max_prompt_length",
            )
        if dropped:
            rank_zero_warn(
                f"{split}: dropped {dropped} of {len(ids)} prompts longer than "
                f"max_prompt_length={self.max_prompt_length} tokens"
            )
        self.longest_prompt = max(self.longest_prompt, max(len(ids[i]) for i in keep))
        data = data.remove_columns([c for c in ("prompt", "input_ids") if c in data.column_names])
        data = data.add_column("prompt", prompts).add_column("input_ids", ids)
        return data.select(keep) if dropped else data

    def _render_and_tokenize(self, data: datasets.Dataset) -> tuple[list[str], list[list[int]]]:
        subjects = data["subject"] if "subject" in data.column_names else [None] * len(data)
        prompts = [
            self.render_prompt(q, s) for q, s in zip(data["question"], subjects, strict=True)
        ]
        # A rendered template carries its own special tokens; a raw question gets the usual ones.
        ids = self.tokenizer(prompts, add_special_tokens=not self.use_chat_template)["input_ids"]
        return prompts, ids

    @staticmethod
    def _require(data: datasets.Dataset | None, split: str) -> datasets.Dataset:
        if data is None:
            raise RuntimeError(f"the {split} prompts are not loaded; call setup() first")
        return data


def _check_sizes(
    batch_size: int,
    val_batch_size: int | None,
    test_batch_size: int | None,
    max_prompt_length: int,
    num_workers: int,
) -> None:
    """Refuse batch sizes and lengths below 1 and a negative worker count."""
    for arg, value in (("batch_size", batch_size), ("max_prompt_length", max_prompt_length)):
        if value < 1:
            raise ValueError(f"{arg} must be >= 1, got {value}")
    for arg, optional in (("val_batch_size", val_batch_size), ("test_batch_size", test_batch_size)):
        if optional is not None and optional < 1:
            raise ValueError(f"{arg} must be >= 1 or None, got {optional}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")


def _check_pretokenized(
    sources: Sequence[PromptSource | None], settings: Mapping[str, str | None]
) -> None:
    """Text settings (system prompt, response prefix, question suffix) would do nothing to a
    pretokenized source's ids: refused, naming the ones that are set."""
    names = [type(s).__name__ for s in sources if getattr(s, "pretokenized", False)]
    set_ = [f"{key} ({value!r})" for key, value in settings.items() if value]
    if names and set_:
        listed = " and ".join(set_) if len(set_) < 3 else ", ".join(set_[:-1]) + f" and {set_[-1]}"
        raise ValueError(
            f"{names[0]} is pretokenized: its input_ids are used as they are, so {listed} "
            f"would not reach the model. Fix: remove {'it' if len(set_) == 1 else 'them'} from "
            "the data config (a module that needs a prefix adds its tokens itself)."
        )
