"""Several prompt sources mixed in target proportions, for multi-domain RL (MGS, arXiv
2602.02301: 1/3 math, 1/3 chat, 1/3 instruction following).

:class:`MixturePrompts` is itself a prompt source: its table is drawn once, by seed, so the
data module's seeded shuffling and its stateful loader make a mixed run resumable mid-epoch
exactly like a single-source one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, Literal

from lit_rlhf.data.sources import PromptSource
from lit_rlhf.lazy import MYPY, Table, lazy_module

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


class MixturePrompts:
    """A seeded mixture of prompt sources with target proportions.

    Each source contributes ``round(weight_i * num_examples)`` rows (largest remainders make the
    counts sum to ``num_examples``): a seeded permutation of its rows, cycled through again when
    it needs more rows than it has. ``schedule: mixed`` then shuffles the mixture, so every
    stretch of it holds the domains in about their proportions (mixed RL, and MGS);
    ``schedule: sequential`` keeps the sources in blocks, in the given order (sequential RL: the
    first source's rows, then the second's, ...; the data module must not shuffle them, see
    ``ordered``). Rows keep their columns (a column another source lacks is None there) and
    their ``task``, unless ``tasks`` renames a source's.

    Args:
        sources: the prompt sources, e.g. ``FilePrompts`` for math, chat and IFEval prompts.
        weights: the target proportion of each source (positive; normalised to sum to 1).
        num_examples: rows in the mixture; None: as many as the sources hold together.
        tasks: a task name per source (its rows' ``task``, which picks their reward in
            ``RewardByTask`` and their domain in gradient surgery); None keeps the rows' own.
        seed: seeds the rows drawn from each source and the order.
        schedule: ``mixed`` or ``sequential`` (domain blocks by step ranges: with batch size b,
            source i trains for about ``weight_i * num_examples / b`` steps).
    """

    def __init__(
        self,
        sources: Sequence[PromptSource],
        weights: Sequence[float] | None = None,
        num_examples: int | None = None,
        tasks: Sequence[str] | None = None,
        seed: int = 0,
        schedule: Literal["mixed", "sequential"] = "mixed",
    ) -> None:
        if schedule not in ("mixed", "sequential"):
            raise ValueError(f"schedule must be 'mixed' or 'sequential', got {schedule!r}")
        self.schedule = schedule
        if not sources:
            raise ValueError("sources must hold at least one prompt source")
        weights = [1.0] * len(sources) if weights is None else list(weights)
        if len(weights) != len(sources) or (tasks is not None and len(tasks) != len(sources)):
            raise ValueError(
                f"{len(sources)} sources need as many weights (got {len(weights)}) and, if "
                f"given, task names (got {None if tasks is None else len(tasks)})"
            )
        if not all(math.isfinite(w) and w > 0 for w in weights):
            raise ValueError(
                f"weights must be positive numbers, got {weights}. Fix: leave a source out "
                "rather than giving it weight 0."
            )
        if num_examples is not None and num_examples < len(sources):
            raise ValueError(
                f"num_examples={num_examples} is fewer than the {len(sources)} sources"
            )
        self.sources, self.tasks, self.seed = list(sources), tasks, seed
        total = sum(weights)
        self.weights = [w / total for w in weights]
        self.num_examples = num_examples

    @property
    def ordered(self) -> bool:
        """Whether the row order is part of the design (``sequential``): the data module
        refuses to shuffle such a source."""
        return self.schedule == "sequential"

    def counts(self, sizes: Sequence[int]) -> list[int]:
        """Rows drawn from each source, given the sources' sizes."""
        n = self.num_examples if self.num_examples is not None else sum(sizes)
        exact = [w * n for w in self.weights]
        counts = [math.floor(x) for x in exact]
        by_remainder = sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])
        for i in by_remainder[: n - sum(counts)]:
            counts[i] += 1
        return counts

    def load(self) -> Table:
        tables = [source.load() for source in self.sources]
        for i, table in enumerate(tables):
            if len(table) == 0:
                raise ValueError(f"source {i} ({type(self.sources[i]).__name__}) has no rows")
        rng = random.Random(self.seed)
        rows: list[dict[str, Any]] = []
        for i, (table, count) in enumerate(zip(tables, self.counts([len(t) for t in tables]),
                                               strict=True)):  # fmt: skip
            order: list[int] = []
            while len(order) < count:
                order += rng.sample(range(len(table)), len(table))
            for index in order[:count]:
                row = dict(table[index])
                if self.tasks is not None:
                    row["task"] = self.tasks[i]
                rows.append(row)
        if self.schedule == "mixed":
            rng.shuffle(rows)
        columns = {key: None for row in rows for key in row}
        return datasets.Dataset.from_list([{**columns, **row} for row in rows])
