"""CPU self time of a benchmark's timed steps by operator kind, in and out of generation (what
runs inside a :class:`~scripts.bench.runner.Timed` wrapper's ``bench::generate`` range)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

GENERATE = "bench::generate"
CATEGORIES = {
    "GEMM": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkl", "mkldnn", "onednn",
             "gemm"),
    "attention": ("attention", "aten::_scaled_dot_product", "aten::_flash", "paged"),
    "optimizer": ("_foreach", "adam", "optimizer.step", "clip_grad"),
    "softmax / log-probs": ("softmax", "aten::gather", "logsumexp", "nll"),
}  # fmt: skip


def category(name: str) -> str:
    low = name.lower()
    hits = (label for label, needles in CATEGORIES.items() if any(n in low for n in needles))
    return next(hits, "elementwise, Python and other")


class OpProfile:
    """``torch.profiler`` from step ``start_step`` on (:meth:`step` is a ``StepTimer``'s
    ``on_start`` hook) to :meth:`summary`."""

    def __init__(self, start_step: int) -> None:
        self.start_step, self.steps, self.prof = start_step, 0, None

    def step(self, index: int) -> None:
        if index == self.start_step and self.prof is None:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.prof.__enter__()
        self.steps += self.prof is not None

    def summary(self, top: int = 12) -> dict[str, Any]:
        """Seconds per step by category (in generation / the rest) and the top operators of
        the rest by self time."""
        if self.prof is None:
            return {}
        self.prof.__exit__(None, None, None)
        events = list(self.prof.events())
        spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == GENERATE]
        split: dict[str, dict[str, float]] = defaultdict(lambda: {"generation": 0.0, "rest": 0.0})
        ops: dict[str, float] = defaultdict(float)
        for event in events:
            inside = any(lo <= event.time_range.start <= hi for lo, hi in spans)
            seconds = event.self_cpu_time_total * 1e-6 / self.steps
            split[category(event.name)]["generation" if inside else "rest"] += seconds
            ops[event.name] += 0.0 if inside else seconds
        ranked = sorted(ops.items(), key=lambda item: -item[1])[:top]
        return {"steps": self.steps, "categories": dict(split), "top_rest": ranked}
