"""Live tensor bytes over a stretch of code, on any device the torch profiler sees.

On CPU there is no ``torch.cuda.max_memory_allocated``. The torch profiler with
``profile_memory=True`` records every allocation and free of PyTorch's allocators (CPU and CUDA)
with the allocator's running total of bytes handed out inside the profiled stretch (blocks
allocated before it started are left out, their frees too). :class:`LiveTensorBytes` turns those
events into a timeline, so the peak of live tensor storage is read relative to the baseline at
the start, for the whole stretch or within named phases marked with :meth:`LiveTensorBytes.phase`
(``record_function`` ranges).

    tracker = LiveTensorBytes()
    with tracker:
        setup()
        with tracker.phase("update"):
            update()
    tracker.peak()            # bytes above the baseline, whole stretch
    tracker.peak("update")    # the same, within the update phase's ranges
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PHASE_PREFIX = "lit_rlhf.phase:"


@dataclass
class Timeline:
    """Allocation events of one device, in time order: ``times`` (ns) and ``live`` (bytes alive
    after each event, relative to the start of the profiled stretch)."""

    times: list[int] = field(default_factory=list)
    live: list[int] = field(default_factory=list)

    def peak(self, start: int | None = None, end: int | None = None) -> int:
        """The largest live total in ``[start, end]`` (ns), counting what was live on entry."""
        if not self.times:
            return 0
        lo = 0 if start is None else bisect.bisect_left(self.times, start)
        hi = len(self.times) if end is None else bisect.bisect_right(self.times, end)
        entry = self.live[lo - 1] if lo > 0 else 0
        return max([entry, *self.live[lo:hi]])

    def at(self, time: int) -> int:
        """Bytes live at ``time`` (ns)."""
        i = bisect.bisect_right(self.times, time)
        return self.live[i - 1] if i > 0 else 0


def _walk(nodes: Any) -> Iterator[Any]:
    stack = list(reversed(list(nodes)))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(list(node.children)))


class LiveTensorBytes:
    """A context manager that profiles memory; after exit, :meth:`peak` and :meth:`at_start`
    read the live tensor bytes of ``device`` ("cpu" or "cuda")."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.timeline = Timeline()
        self.phases: dict[str, list[tuple[int, int]]] = {}
        self.live_at_end: dict[int, int] = {}  # address -> bytes of blocks never freed inside
        self._profile: Any = None

    def __enter__(self) -> LiveTensorBytes:
        activities = [ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profile = profile(activities=activities, profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profile.__exit__(*exc)
        if exc[0] is None:
            self._read(self._profile.profiler.kineto_results.experimental_event_tree())
        self._profile = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a stretch as (one occurrence of) phase ``name``."""
        with record_function(PHASE_PREFIX + name):
            yield

    def _read(self, roots: Any) -> None:
        from torch._C._profiler import _EventType

        events: list[tuple[int, int, int]] = []  # (time, size, running total)
        events_ptr: list[tuple[int, int, int]] = []  # (time, address, size)
        for node in _walk(roots):
            if node.tag == _EventType.Allocation:
                fields = node.extra_fields
                if str(fields.device).split(":")[0] == self.device:
                    events.append((node.start_time_ns, fields.alloc_size, fields.total_allocated))
                    events_ptr.append((node.start_time_ns, fields.ptr, fields.alloc_size))
            elif node.name.startswith(PHASE_PREFIX):
                span = (node.start_time_ns, node.end_time_ns)
                self.phases.setdefault(node.name[len(PHASE_PREFIX) :], []).append(span)
        events.sort(key=lambda e: e[0])
        for _, ptr, size in sorted(events_ptr, key=lambda e: e[0]):
            if size > 0:
                self.live_at_end[ptr] = size
            else:
                self.live_at_end.pop(ptr, None)
        if not events:
            return
        _, first_size, first_total = events[0]
        base = first_total - first_size  # the allocator's total before the first event
        self.timeline = Timeline([e[0] for e in events], [e[2] - base for e in events])

    def peak(self, phase: str | None = None) -> int:
        """Peak live bytes above the baseline at the start: over everything, or over every
        occurrence of ``phase``."""
        if phase is None:
            return self.timeline.peak()
        spans = self._spans(phase)
        return max(self.timeline.peak(start, end) for start, end in spans)

    def untracked_bytes(self, tensors: Iterable[torch.Tensor]) -> int:
        """Bytes of the distinct storages of ``tensors`` (alive after the stretch) that the
        allocator did not hand out inside it: allocated before it, or not by an allocator at
        all (safetensors weights memory-mapped from the checkpoint file). Add them to the peaks
        to count every resident tensor."""
        seen: set[int] = set()
        total = 0
        for tensor in tensors:
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in seen or ptr == 0:
                continue
            seen.add(ptr)
            if ptr not in self.live_at_end:
                total += storage.nbytes()
        return total

    def at_start(self, phase: str) -> int:
        """Live bytes (above the baseline) when ``phase`` first starts."""
        return self.timeline.at(self._spans(phase)[0][0])

    def _spans(self, phase: str) -> list[tuple[int, int]]:
        spans = self.phases.get(phase)
        if not spans:
            raise ValueError(
                f"no phase {phase!r} was recorded (recorded: {sorted(self.phases)}). Fix: wrap "
                f"the code in `with tracker.phase({phase!r}):` inside the tracked stretch."
            )
        return spans
