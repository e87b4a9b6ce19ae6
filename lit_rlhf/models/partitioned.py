"""Full-size access to parameters that DeepSpeed ZeRO-3 partitions across ranks."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from torch import Tensor


def gathered(*params: Tensor) -> AbstractContextManager[Any]:
    """Full-size views of ``params`` inside the context: gathers DeepSpeed ZeRO-3 partitions (a
    collective: every rank must call it with the same parameters in the same order), a no-op
    when none is partitioned."""
    if any(hasattr(param, "ds_id") for param in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(params), modifier_rank=None)
    return nullcontext()
