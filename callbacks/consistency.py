"""ConsistRM's label-free rewards for a generative reward model (arXiv 2604.07484), as reward-term
callbacks (see :mod:`lit_rlhf.training.protocols`): any module that asks its callbacks for reward
terms gets them, and they need no gold label.

- :class:`ConsistencyAnswerReward` (temporal consistency): per query, a pseudo-label from the
  format-valid verdicts of this round plus the query's memory of past pseudo-labels; +1 / -1 per
  rollout for agreeing / disagreeing, nothing when the pseudo-label is 0. A query none of whose
  rollouts this round is readable gets no pseudo-label and its memory is left as it is (the
  authors' code skips the update: appending the memory's own sign would reinforce it with no
  evidence). The memory is training state: it is saved in every checkpoint and restored on
  resume, and under data parallelism every rank applies every rank's updates, so all ranks hold
  the same memory. Seed it with ``initial_memory`` from ``scripts/data/seed_consistrm_memory.py``
  (the authors: 8 votes of the starting judge per query).
- :class:`CritiqueConsistencyReward` (semantic consistency): embeds each rollout's whole response
  (the authors' code; ``text: critique`` embeds only the text before the result); the most
  self-consistent half of the rollouts that agreed with the pseudo-label get a bonus.

The constants default to the authors' code (format term +0.1 / -3 from the module's
``VerdictReward``, answer +1 / -1 / 0, bonus 0.1); the paper's note (no format term, -5 for a
format violation) is ``model.init_args.reward: {class_path: lit_rlhf.rewards.VerdictReward,
init_args: {mode: format, format_bonus: 0.0, invalid: -5.0}}`` (docs/grm.md).

Put the answer reward before the critique reward in ``trainer.callbacks``: the critique bonus
reads the answer reward's terms. Rules and constants: :mod:`lit_rlhf.algos.consistency`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from lightning import Callback
from torch import Tensor
from typing_extensions import override

from lit_rlhf.algos.consistency import (
    MODE_RULES,
    ModeRule,
    answer_rewards,
    critique_bonus,
    pseudo_label,
    update_memory,
)
from lit_rlhf.algos.judge import JUDGE_TAGS, JudgeFormat, critique_text, response_text
from lit_rlhf.models.embedder import MINILM, EmbedderDtype, Pooling, TextEmbedder
from lit_rlhf.training.protocols import RewardContext


def _groups(query_ids: Sequence[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(query_ids):
        groups[q].append(i)
    return groups


class ConsistencyAnswerReward(Callback):
    """Args:
    cap: memory entries kept per query (METHODS: 20).
    agree, disagree, unparsable: the answer reward of a rollout whose verdict equals, differs
        from, or cannot be compared with the pseudo-label (0 for all when it is 0). Unparsable
        defaults to 0 because the module's format reward already gives such outputs its
        ``invalid`` score (the authors' code); set -1 to follow the paper's text.
    initial_memory: optional JSONL of ``{"query_id": ..., "labels": [-1, 1, ...]}`` rows that
        seeds the memory: ``scripts/data/seed_consistrm_memory.py`` writes the starting judge's
        votes (the authors: 8 per query).
    initial_overflow: a row of ``initial_memory`` with more than ``cap`` labels: ``newest``
        keeps its last ``cap`` labels (labels are oldest first; warned once, with the number
        of rows cut), ``evict`` replays the labels through the training-time eviction (drop one
        entry farthest from the mode per label past the cap), ``error`` refuses the file.
    mode_rule: the memory mode that eviction measures from: ``authors`` (their code: +1 against
        everything else, a tie gives 0) or ``plurality`` (see
        :func:`~lit_rlhf.algos.consistency.memory_mode`).
    tags, subject, prefix, suffix: the judge output format, the data's assistant pre-fill and
        a fixed ending (see ``VerdictReward``).
    seed: seeds the eviction tie-break generator (checkpointed).
    use_memory: False is the paper's "w/o memory" ablation: the pseudo-label is the sign of
        this round's votes alone and no memory is kept (``initial_memory`` must be unset).
    unseeded: True trains with a memory that starts empty. ConsistRM's method seeds it (the
        authors: 8 votes of the starting judge per query), so a fit with ``use_memory`` and no
        ``initial_memory`` is refused at setup unless this is True (the tiny demo, tests and the
        preset dry run set it); ignored when ``initial_memory`` is set.
    """

    def __init__(
        self,
        cap: int = 20,
        agree: float = 1.0,
        disagree: float = -1.0,
        unparsable: float = 0.0,
        initial_memory: str | None = None,
        tags: Sequence[str] = JUDGE_TAGS,
        subject: str = "Response",
        prefix: str = "",
        suffix: str = "",
        seed: int = 0,
        mode_rule: ModeRule = "authors",
        use_memory: bool = True,
        initial_overflow: Literal["newest", "evict", "error"] = "newest",
        unseeded: bool = False,
    ) -> None:
        if not use_memory and initial_memory is not None:
            raise ValueError(
                "use_memory=False keeps no memory, so initial_memory would be ignored. Fix: "
                "unset initial_memory, or set use_memory=True."
            )
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        if mode_rule not in MODE_RULES:
            raise ValueError(
                f"mode_rule must be one of {MODE_RULES}, got {mode_rule!r}. Fix: 'authors' (the "
                "ConsistRM code) or 'plurality'."
            )
        if agree <= disagree:
            raise ValueError(f"agree ({agree}) must be above disagree ({disagree})")
        if initial_overflow not in ("newest", "evict", "error"):
            raise ValueError(
                f"initial_overflow must be 'newest', 'evict' or 'error', got {initial_overflow!r}"
            )
        if initial_memory is not None and not Path(initial_memory).is_file():
            raise FileNotFoundError(f"initial_memory {initial_memory!r} is not a file")
        self.cap, self.agree, self.disagree, self.unparsable = cap, agree, disagree, unparsable
        self.initial_memory, self.mode_rule = initial_memory, mode_rule
        self.use_memory, self.initial_overflow = use_memory, initial_overflow
        self.unseeded = unseeded
        self.format = JudgeFormat(tuple(tags), subject, prefix, suffix)
        self.memory: dict[str, list[int]] = {}
        self.last_pseudo: dict[str, int] = {}
        self.generator = torch.Generator().manual_seed(seed)
        self._seeded = False

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self.use_memory and self.initial_memory is None and not self.unseeded:
            raise ValueError(
                "ConsistencyAnswerReward has no initial_memory: ConsistRM would start from an "
                "empty memory, which is not the paper's method. Fix: set initial_memory to the "
                "JSONL of scripts/data/seed_consistrm_memory.py, or unseeded: true to train "
                "without a seed."
            )
        if self.initial_memory is not None and not self._seeded and not self.memory:
            self.memory = read_memory(
                self.initial_memory,
                cap=self.cap,
                overflow=self.initial_overflow,
                mode_rule=self.mode_rule,
                generator=self.generator,
            )
        self._seeded = True

    def reward_term(
        self, trainer: Any, pl_module: Any, ctx: RewardContext
    ) -> tuple[Tensor, dict[str, Tensor]]:
        verdicts = [
            self.format.verdict(r, row.get("subject"))
            for r, row in zip(ctx.responses, ctx.rows, strict=True)
        ]
        term = torch.zeros(len(verdicts))
        updates: list[tuple[str, int]] = []
        unread = 0
        for query, idx in _groups(ctx.query_ids).items():
            labels = [verdicts[i] for i in idx]
            if all(label is None for label in labels):  # no evidence: no label, no update
                term[idx] = self.unparsable
                unread += 1
                continue
            y = pseudo_label(labels, self.memory.get(query, []))
            term[idx] = answer_rewards(
                labels, y, agree=self.agree, disagree=self.disagree, unparsable=self.unparsable
            )
            updates.append((query, y))
        stats = self._stats(updates, ctx)
        stats["unreadable_queries"] = torch.tensor(float(unread))
        for query, y in sorted(_all_ranks(updates)) if self.use_memory else []:  # same order
            self.memory[query] = update_memory(
                self.memory.get(query, []),
                y,
                cap=self.cap,
                generator=self.generator,
                mode_rule=self.mode_rule,
            )
        self.last_pseudo.update(dict(updates))
        return term.to(ctx.scores.device), stats

    def _stats(self, updates: list[tuple[str, int]], ctx: RewardContext) -> dict[str, Tensor]:
        labels = {q: y for q, y in updates}
        supervised = [y != 0 for y in labels.values()]
        flips = [labels[q] != self.last_pseudo[q] for q in labels if q in self.last_pseudo]
        stats = {"supervised_fraction": torch.tensor(sum(supervised) / max(1, len(supervised)))}
        if flips:
            stats["flip_rate"] = torch.tensor(sum(flips) / len(flips))
        gold = {q: row.get("label") for q, row in zip(ctx.query_ids, ctx.rows, strict=True)}
        judged = [(labels[q], g) for q, g in gold.items() if g in (-1, 1) and labels.get(q, 0) != 0]
        if judged:  # diagnostic only: gold labels never enter the reward
            stats["pseudo_label_accuracy"] = torch.tensor(
                sum(y == g for y, g in judged) / len(judged)
            )
        return stats

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "memory": {q: list(m) for q, m in self.memory.items()},
            "last_pseudo": dict(self.last_pseudo),
            "generator": self.generator.get_state(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.memory = {q: [int(x) for x in m] for q, m in state_dict["memory"].items()}
        self.last_pseudo = {q: int(y) for q, y in state_dict["last_pseudo"].items()}
        self.generator.set_state(state_dict["generator"])
        self._seeded = True  # a resumed memory is never overwritten by the seed file


def read_memory(
    path: str,
    *,
    cap: int,
    overflow: str = "newest",
    mode_rule: ModeRule = "authors",
    generator: torch.Generator | None = None,
) -> dict[str, list[int]]:
    """Seed memories from a JSONL of ``{"query_id": str, "labels": [int, ...]}`` rows; a row
    over ``cap`` is cut as ``overflow`` says (see ``ConsistencyAnswerReward.initial_overflow``)."""
    memory: dict[str, list[int]] = {}
    cut = 0
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            labels = row.get("labels") if isinstance(row, dict) else None
            if not isinstance(labels, list) or any(x not in (-1, 0, 1) for x in labels):
                raise ValueError(
                    f"{path} line {number}: 'labels' must be a list of -1 / 0 / 1, got {labels!r}"
                )
            if "query_id" not in row:
                raise ValueError(f"{path} line {number}: missing 'query_id'")
            if len(labels) > cap and overflow == "error":
                raise ValueError(
                    f"{path} line {number}: {len(labels)} labels for query "
                    f"{row['query_id']!r}, above cap={cap}. Fix: raise cap, shorten the row, or "
                    "set initial_overflow: newest (keep the last cap) or evict."
                )
            cut += len(labels) > cap
            memory[str(row["query_id"])] = _capped([int(x) for x in labels], cap, overflow,
                                                   mode_rule, generator)  # fmt: skip
    if cut and overflow == "newest":
        warnings.warn(
            f"{path}: {cut} rows hold more than cap={cap} labels; each keeps its last {cap} "
            "(initial_overflow: newest)",
            stacklevel=3,
        )
    return memory


def _capped(
    labels: list[int], cap: int, overflow: str, mode_rule: ModeRule, generator: Any
) -> list[int]:
    if len(labels) <= cap or overflow == "newest":
        return labels[-cap:]
    kept: list[int] = []
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    for label in labels:  # as training would have built it, one label at a time
        kept = update_memory(kept, label, cap=cap, generator=generator, mode_rule=mode_rule)
    return kept


def _all_ranks(updates: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Every rank's (query, pseudo-label) updates (this rank's alone without a process group)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return updates
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, updates)
    return [tuple(u) for part in gathered for u in part]


class CritiqueConsistencyReward(Callback):
    """Args:
    embedder: the encoder of the critiques: ``builtin:all-minilm-l6-v2`` (default, offline),
        a hub id or folder (the authors: ``Qwen/Qwen3-Embedding-4B`` with ``pooling: last``,
        ``max_length: 1024``, ``dtype: float16``).
    pooling, normalize, max_length, batch_size, dtype: see
        :class:`~lit_rlhf.models.TextEmbedder`.
    text: what is embedded: ``response`` (the authors' code: the whole response, a think trace
        removed) or ``critique`` (the text before the ``<Result>``: criterion and analysis).
    bonus: added to the top ceil(n/2) most consistent of the n rollouts with answer reward
        ``positive``.
    answer_term: the callback whose terms are the answer rewards.
    """

    def __init__(
        self,
        embedder: str = MINILM,
        pooling: Pooling = "mean",
        normalize: bool = True,
        max_length: int = 256,
        batch_size: int = 32,
        bonus: float = 0.1,
        positive: float = 1.0,
        answer_term: str = "ConsistencyAnswerReward",
        text: Literal["response", "critique"] = "response",
        dtype: EmbedderDtype = "float32",
    ) -> None:
        if bonus < 0:
            raise ValueError(f"bonus must be >= 0, got {bonus}")
        if text not in ("response", "critique"):
            raise ValueError(f"text must be 'response' or 'critique', got {text!r}")
        self.embedder = TextEmbedder(
            embedder, pooling, normalize, max_length, batch_size, dtype=dtype
        )
        self.text = text
        self.bonus, self.positive, self.answer_term = bonus, positive, answer_term

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.embedder.device = pl_module.device

    def reward_term(
        self, trainer: Any, pl_module: Any, ctx: RewardContext
    ) -> tuple[Tensor, dict[str, Tensor]]:
        answers = ctx.terms.get(self.answer_term)
        if answers is None:
            raise ValueError(
                f"CritiqueConsistencyReward reads the answer rewards of {self.answer_term}, which "
                "has not run before it. Fix: list ConsistencyAnswerReward before "
                "CritiqueConsistencyReward in trainer.callbacks."
            )
        start = time.perf_counter()
        extract = response_text if self.text == "response" else critique_text
        embeddings = self.embedder([extract(r) for r in ctx.responses])
        seconds = time.perf_counter() - start
        term, consistency = torch.zeros(len(answers)), torch.ones(len(answers))
        for idx in _groups(ctx.query_ids).values():
            bonus, agreement = critique_bonus(
                embeddings[idx], answers[idx].cpu(), bonus=self.bonus, positive=self.positive
            )
            term[idx], consistency[idx] = bonus.float().cpu(), agreement.float().cpu()
        stats = {
            "bonus_fraction": (term > 0).float().mean(),
            "consistency": consistency.mean(),
            "embed_seconds": torch.tensor(seconds),
        }
        return term.to(ctx.scores.device), stats
