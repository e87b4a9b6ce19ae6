"""An engine that keeps its requests across a weight push, as a user would write one (the
partial-rollout contract of ``lit_rlhf.training.partial``): it serves its own copy of the
weights, generates ``chunk`` tokens at a time with ``HFGenerationEngine`` so a push can land
between two chunks of a request, and tags each token with the label of the weights that sampled
it. ``hold``: a request that starts after the first waits after its first chunk (at most
``hold_s`` seconds) until a push lands, so it finishes with tokens of two versions.

Self-contained (lit_rlhf and torch only): the CLI test writes this file into a folder outside
the repository and names the class on the command line."""

from __future__ import annotations

import copy
import threading

import torch

from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.rollout.base import call_budget
from lit_rlhf.rollout.hf import response_mask_from_eos
from lit_rlhf.types import GenerationOutput


class ChunkedServingEngine(HFGenerationEngine):
    supports_partial_rollouts = True
    serves_own_weights = True
    separate_numerics = True

    def __init__(self, chunk: int = 2, hold: bool = False, hold_s: float = 20.0, **kwargs):
        super().__init__(**kwargs)
        self.chunk, self.hold, self.hold_s = chunk, hold, hold_s
        self.weight_version = 0  # the label of the next push (the trainer sets it)
        self.served_version = 0
        self.started = False
        self.served = None  # the engine's own copy of the weights
        self.pushes: list[tuple[int, bool]] = []  # (label, a request was in flight)
        self._lock = threading.Condition()
        self._in_flight = 0

    def _push(self, model) -> None:
        with self._lock:  # between two chunks: requests in flight are frozen, not aborted
            if self.served is None:
                self.served = copy.deepcopy(model).requires_grad_(False)
            else:
                with torch.no_grad():
                    for kept, live in zip(
                        self.served.state_dict().values(), model.state_dict().values(), strict=True
                    ):
                        kept.copy_(live)
            self.served_version = self.weight_version
            self.pushes.append((self.weight_version, self._in_flight > 0))
            self._lock.notify_all()

    def _wait_for_push(self, pushed: int) -> None:
        """Until more than ``pushed`` pushes have landed (at most ``hold_s`` seconds)."""
        with self._lock:
            self._lock.wait_for(lambda: len(self.pushes) > pushed, self.hold_s)

    def sync_weights(self, model) -> None:
        if self.started:
            self._push(model)

    @torch.no_grad()
    def generate(self, model, input_ids, attention_mask, tokenizer, **kwargs):
        first = not self.started
        if first:
            self._push(model)
            self.started = True
        budget = call_budget(self.max_new_tokens, kwargs.pop("max_new_tokens", None))
        ids, mask = input_ids, attention_mask.bool()
        pieces, logps, tags = [], [], []
        with self._lock:
            self._in_flight += 1
        try:
            while sum(p.shape[1] for p in pieces) < budget:
                n = min(self.chunk, budget - sum(p.shape[1] for p in pieces))
                with self._lock:
                    out = super().generate(
                        self.served, ids, mask, tokenizer, max_new_tokens=n, **kwargs
                    )
                    version, pushed = self.served_version, len(self.pushes)
                if out.response_ids.shape[1] == 0:
                    break
                pieces.append(out.response_ids)
                logps.append(out.log_probs)
                tags.append(torch.full_like(out.response_ids, version))
                ids = torch.cat([ids, out.response_ids], 1)
                mask = torch.cat([mask, torch.ones_like(out.response_ids, dtype=torch.bool)], 1)
                response = torch.cat(pieces, 1)
                if not response_mask_from_eos(response, tokenizer.eos_token_id)[:, -1].any():
                    break  # every response ended
                if self.hold and not first and len(pieces) == 1:
                    self._wait_for_push(pushed)
        finally:
            with self._lock:
                self._in_flight -= 1
        response = torch.cat(pieces, 1)
        keep = response_mask_from_eos(response, tokenizer.eos_token_id)
        chosen = None if logps[0] is None else torch.cat(logps, 1).masked_fill(~keep, 0.0)
        return GenerationOutput(
            response.masked_fill(~keep, tokenizer.pad_token_id),
            keep,
            chosen,
            torch.cat(tags, 1).masked_fill(~keep, -1),
        )
