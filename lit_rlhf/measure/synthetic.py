"""The stand-ins of a measured update (:mod:`lit_rlhf.measure.update`): networks built with random
weights instead of loaded, a synthetic rollout instead of generated, a tokenizer's two ids, and
the recorder of each update phase's memory and time."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def random_weights(device: torch.device, layers: int | None) -> Iterator[None]:
    """``from_pretrained`` of transformers' auto classes builds a randomly initialised network
    of the plan's architecture on ``device`` instead (``layers``: fewer decoder layers)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from lit_rlhf.plan.architectures import architecture
    from lit_rlhf.plan.params import hf_config

    def config_of(name: str) -> Any:
        arch = architecture(str(name))
        if layers is not None:
            arch = dataclasses.replace(arch, num_hidden_layers=min(layers, arch.num_hidden_layers))
        return hf_config(arch)

    def builder(cls: Any) -> Callable[..., Any]:
        def build(name: str, *args: Any, **kwargs: Any) -> Any:
            config = kwargs.get("config") or config_of(name)
            dtype = kwargs.get("dtype") or torch.float32
            with torch.device(device):
                return cls.from_config(config, dtype=dtype)

        return build

    saved = {cls: cls.__dict__["from_pretrained"] for cls in (AutoModel, AutoModelForCausalLM)}
    saved_config = AutoConfig.__dict__["from_pretrained"]
    try:
        for cls in saved:
            cls.from_pretrained = builder(cls)  # type: ignore[method-assign]
        AutoConfig.from_pretrained = config_of  # type: ignore[method-assign,assignment]
        yield
    finally:
        for cls, method in saved.items():
            cls.from_pretrained = method  # type: ignore[method-assign]
        AutoConfig.from_pretrained = saved_config  # type: ignore[method-assign]


class StandInTokenizer:
    """A tokenizer's ids (the update reads only the end-of-sequence and padding ids)."""

    eos_token_id = 0
    pad_token_id = 0


def synthetic_rollout(batch: dict[str, Any], group: int, prompt_len: int, response: int,
                      vocab: int, device: torch.device, tasks: list[str]) -> Any:  # fmt: skip
    """``group`` full-length responses for each prompt of ``batch``, random tokens and scores;
    the prompts' tasks cycle through ``tasks`` (a multi-domain run's domains)."""
    from lit_rlhf.types import Rollout

    n = len(batch["prompt"]) * group
    ids = torch.randint(1, vocab, (n, prompt_len + response), device=device)
    ones = torch.ones(n, prompt_len + response, dtype=torch.bool, device=device)
    return Rollout(
        prompt_ids=ids[:, :prompt_len], prompt_mask=ones[:, :prompt_len],
        response_ids=ids[:, prompt_len:], response_mask=ones[:, prompt_len:],
        sample_log_probs=-torch.rand(n, response, device=device),
        group_ids=torch.arange(len(batch["prompt"]), device=device).repeat_interleave(group),
        query_ids=[str(i // group) for i in range(n)],
        tasks=[tasks[i // group % len(tasks)] for i in range(n)],
        rows=[{}] * n, prompts=[""] * n, responses=[""] * n,
        scores=torch.randn(n, device=device), reward_info={},
    )  # fmt: skip


class Recorder:
    """Wraps ``PolicyStep.prepare`` / ``optimize``: each call's peak memory (CUDA's allocator;
    None elsewhere), the memory held when it starts, its seconds and the update's perf stats."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.calls = device, []  # type: ignore[var-annotated]
        self.cuda = device.type == "cuda"

    def wrap(self, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
        from lit_rlhf.plan.flops import elapsed, start_timer

        def call(*args: Any) -> Any:
            if self.cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
            held = torch.cuda.memory_allocated(self.device) if self.cuda else None
            start = start_timer(self.device)
            out = method(*args)
            seconds = elapsed(self.device, start)
            peak = torch.cuda.max_memory_allocated(self.device) if self.cuda else None
            perf = {k: float(v) for k, v in out.items() if k[:5] == "perf/"} if isinstance(
                out, dict) else {}  # fmt: skip
            self.calls.append({"phase": phase, "seconds": seconds, "held_bytes": held,
                               "peak_bytes": peak, **perf})  # fmt: skip
            return out

        return call
