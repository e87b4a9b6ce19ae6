"""Generation by ``vllm serve`` processes started outside the trainer (other GPUs or nodes, each
with its own tensor / data parallelism and router): token ids in, token ids, per-token log-probs
and per-token weight versions out; the trainer pushes its weights into them after every update.

Start each server with ``VLLM_SERVER_DEV_MODE=1`` (vLLM then registers its RL endpoints) and
``--enable-scale-out --logprobs-mode processed_logprobs`` (the token-in/token-out endpoint; the
tempered, untruncated log-probs the PPO update expects, as :class:`VLLMGenerationEngine` uses);
docs/scaling.md has the commands. On its first ``generate`` the engine checks every server (the
model it serves, vLLM's version, the endpoints, the log-prob mode), aborts whatever requests a
previous trainer left, and pushes the policy's full weights labelled ``weight_version``: a
resumed run therefore serves the checkpoint's weights before it samples anything.

The weight push (:mod:`lit_rlhf.rollout.server_push`) pauses every server with
``mode=keep`` (requests in flight are frozen, not dropped), loads the new weights, relabels them
and resumes: a request that spans a push finishes with tokens of two versions, which come back in
``GenerationOutput.token_versions`` (partial rollouts; ``rollout.partial_rollouts``). The push
runs in a thread with ``sync_timeout_s`` as its deadline; every HTTP call has
``request_timeout_s``: a server that stops answering ends the run with one line naming it.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_rlhf.rollout.agreement import start_on_every_rank
from lit_rlhf.rollout.base import call_budget, check_sampling_args
from lit_rlhf.rollout.hf import finish_output, response_mask_from_eos
from lit_rlhf.rollout.server_client import (
    WORKER_EXTENSION,
    Completion,
    ServerClient,
    ServerError,
)
from lit_rlhf.rollout.server_push import PUSH_BACKENDS, make_push
from lit_rlhf.rollout.vllm import check_engine_dtype
from lit_rlhf.rollout.vllm_support import _policy_log_probs
from lit_rlhf.types import GenerationOutput

_MAX_SERVER_TEMPERATURE = 2.0  # vLLM's /inference/v1/generate refuses temperatures above 2


class VLLMServerEngine:
    """Samples with running ``vllm serve`` processes and pushes the policy's weights into them.

    Args:
        urls: the servers' base URLs (``http://host:port``); requests are spread over them in
            turn (one server behind a router counts as one URL).
        model: the model id the servers must serve (``/v1/models``); None: whatever the first
            serves, the same on every server.
        max_new_tokens, temperature, top_p, top_k: as in ``VLLMGenerationEngine`` (temperature
            at most 2, vLLM's server limit).
        request_timeout_s: deadline of one HTTP call, a whole generation request included.
        sync_timeout_s: deadline of one weight push (every server).
        push: how weights reach the servers: ``disk`` (safetensors files in ``push_dir``, loaded
            by each server's ``reload_weights``; the folder must be visible to the servers: the
            same machine or a shared file system; the path that runs on CPU) or ``nccl`` (vLLM's
            NCCL weight transfer to GPU servers; not verified here: no GPU with vLLM was
            available).
        push_dir: where ``disk`` pushes write (None: a temporary folder).
        push_bucket_bytes: the bytes of whole decoder blocks gathered and written at a time.
        dtype: the dtype the pushed weights are cast to (``auto``: bfloat16 from a CUDA policy,
            else the policy's), as the server's ``--dtype``.
        max_concurrency: requests in flight at once from this process.
        request_seeds: one seed per sampled request from torch's (checkpointed) generator.
        api_key: the servers' ``--api-key``, if set.
    """

    separate_numerics = True
    serves_own_weights = True
    supports_partial_rollouts = True

    def __init__(
        self,
        urls: list[str],
        model: str | None = None,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        request_timeout_s: float = 600.0,
        sync_timeout_s: float = 600.0,
        push: str = "disk",
        push_dir: str | None = None,
        push_bucket_bytes: int = 512 << 20,
        dtype: str = "auto",
        max_concurrency: int = 64,
        request_seeds: bool = True,
        api_key: str | None = None,
    ) -> None:
        check_sampling_args(max_new_tokens, temperature, top_p, top_k)
        _check_settings(urls, temperature, request_timeout_s, sync_timeout_s, push)
        if not (isinstance(push_bucket_bytes, int) and push_bucket_bytes > 0):
            raise ValueError(f"push_bucket_bytes must be a positive int, got {push_bucket_bytes}")
        if not (isinstance(max_concurrency, int) and max_concurrency >= 1):
            raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency}")
        check_engine_dtype(dtype, None)
        self.urls = list(urls)
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = max(top_k, 0)
        self.request_timeout_s = request_timeout_s
        self.sync_timeout_s = sync_timeout_s
        self.dtype = dtype
        self.max_concurrency = max_concurrency
        self.request_seeds = request_seeds
        self.clients = [ServerClient(u, request_timeout_s, api_key) for u in self.urls]
        self.pusher = make_push(push, self.clients, push_dir, push_bucket_bytes, sync_timeout_s)
        self.weight_version = 0  # the label of the next push; the trainer sets it (updates done)
        self.started = False
        self.last_sync_s = 0.0
        self.last_sync_bytes = 0
        self._turn = itertools.count()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def truncates(self) -> bool:
        """Whether top-k / top-p cut the sampling distribution (log-probs then need a forward)."""
        return self.top_k > 0 or self.top_p < 1.0

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        model: nn.Module,
        input_ids: Tensor,
        attention_mask: Tensor,
        tokenizer: Any,
        *,
        greedy: bool = False,
        log_probs: bool = True,
        max_new_tokens: int | None = None,
    ) -> GenerationOutput:
        if not self.started:
            self.start(model)
        budget = call_budget(self.max_new_tokens, max_new_tokens)
        mask = attention_mask.bool()
        prompts = [input_ids[i][mask[i]].tolist() for i in range(len(input_ids))]
        seeds: list[int | None] = [None] * len(prompts)
        if self.request_seeds and not greedy:
            seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        params = [self._sampling(tokenizer, greedy, log_probs, budget, s) for s in seeds]
        pool = self._pool = self._pool or ThreadPoolExecutor(self.max_concurrency, "lit-rlhf-req")
        servers = [self.clients[next(self._turn) % len(self.clients)] for _ in prompts]
        futures = [
            pool.submit(c.generate, p, s) for c, p, s in zip(servers, prompts, params, strict=True)
        ]
        done = [f.result() for f in futures]  # the first ServerError stops here
        ids, chosen, versions = self._padded(done, tokenizer.pad_token_id, log_probs)
        ids = ids.to(input_ids.device)
        response_mask = response_mask_from_eos(ids, tokenizer.eos_token_id)
        if chosen is not None:
            chosen = chosen.to(input_ids.device)
        if log_probs and self.truncates and not greedy:
            ids = ids.masked_fill(~response_mask, tokenizer.pad_token_id)
            chosen = _policy_log_probs(model, input_ids, mask, ids, response_mask, self.temperature)
        out = finish_output(ids, response_mask, chosen, tokenizer.pad_token_id)
        out.token_versions = versions.to(input_ids.device).masked_fill(~response_mask, -1)
        return out

    def _sampling(
        self, tokenizer: Any, greedy: bool, log_probs: bool, budget: int, seed: int | None
    ) -> dict[str, Any]:
        eos = tokenizer.eos_token_id
        params: dict[str, Any] = {
            "max_tokens": budget,
            "temperature": 0.0 if greedy else self.temperature,
            "top_p": 1.0 if greedy else self.top_p,
            "top_k": 0 if greedy else self.top_k,
            "ignore_eos": True,  # stop on our tokenizer's EOS only, as the other engines do
            "stop_token_ids": [] if eos is None else torch.as_tensor(eos).reshape(-1).tolist(),
            "detokenize": False,
        }
        if log_probs:
            params["logprobs"] = 0
        if seed is not None:
            params["seed"] = int(seed)
        return params

    def _padded(
        self, done: list[Completion], pad_id: int, log_probs: bool
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        width = max([len(c.token_ids) for c in done] + [1])
        ids = torch.full((len(done), width), pad_id, dtype=torch.long)
        versions = torch.full((len(done), width), -1, dtype=torch.long)
        chosen = torch.zeros(len(done), width) if log_probs else None
        for i, c in enumerate(done):
            n = len(c.token_ids)
            ids[i, :n] = torch.tensor(c.token_ids, dtype=torch.long)
            versions[i, :n] = torch.tensor([self._label(v) for v in c.versions], dtype=torch.long)
            if chosen is not None:
                if c.log_probs is None or len(c.log_probs) != n:
                    raise ServerError(
                        f"a vLLM server returned {n} tokens without their log-probs. Fix: use "
                        "vLLM >= 0.32, whose /inference/v1/generate returns them"
                    )
                chosen[i, :n] = torch.tensor(c.log_probs)
        return ids, chosen, versions

    def _label(self, label: str) -> int:
        if not label.lstrip("-").isdigit():
            raise ServerError(
                f"a vLLM server sampled tokens with weights labelled {label!r}, not a weight "
                "version this trainer pushed (another client changed its weights?). Fix: one "
                "trainer per server"
            )
        return int(label)

    # ------------------------------------------------------------------ lifecycle
    def start(self, model: nn.Module) -> None:
        """Preflight every server, abort what a previous trainer left running there, and push
        the full weights of ``model`` with label ``weight_version`` (every rank calls it: the
        gathers under ZeRO-3 are collective; rank 0 talks to the servers)."""
        # every rank learns whether rank 0's checks passed (not one rank raising while the
        # others wait in the push's first gather)
        start_on_every_rank("the vLLM servers' preflight", self._check_servers)
        self._push(model, full=True)
        self.started = True
        if _rank() == 0:
            print(
                f"lit-rlhf: {len(self.clients)} vLLM server(s) serve weight version "
                f"{self.weight_version} ({self.last_sync_bytes / 2**20:.1f} MiB pushed in "
                f"{self.last_sync_s:.2f} s)",
                flush=True,
            )

    def _check_servers(self) -> None:
        """Rank 0: resume, abort leftovers on and preflight every server (other ranks: none)."""
        if _rank() != 0:
            return
        for client in self.clients:
            if client.is_paused():  # a trainer that died inside a push leaves it paused
                client.resume()
            aborted = client.abort_all()
            self.model = preflight(client, self.model)
            if aborted:
                print(f"lit-rlhf: aborted {aborted} requests left on {client.url}")

    def sync_weights(self, model: nn.Module) -> None:
        """Push the policy's weights (labelled ``weight_version``) into every server; requests
        in flight are frozen during the push and continue with the new weights."""
        if not self.started:
            return  # the first generate pushes everything
        self._push(model, full=False)

    def _push(self, model: nn.Module, full: bool) -> None:
        start = time.perf_counter()
        self.last_sync_bytes = self.pusher.push(
            model, str(self.weight_version), dtype=self.dtype, full=full, rank=_rank()
        )
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # no rank samples before rank 0 has pushed
        self.last_sync_s = time.perf_counter() - start

    def close(self) -> None:
        """Stop this process's requests and HTTP connections (the servers keep running)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self.pusher.close()
        for client in self.clients:
            client.close()


def _check_settings(
    urls: list[str], temperature: float, request_timeout_s: float, sync_timeout_s: float,
    push: str,
) -> None:  # fmt: skip
    """Refuse server settings that cannot work, naming the fix."""
    if isinstance(urls, str) or not urls or not all(isinstance(u, str) for u in urls):
        raise ValueError(
            f"urls must be a non-empty list of server URLs, got {urls!r}. Fix: urls: "
            "[http://HOST:PORT, ...], one per `vllm serve` process (docs/scaling.md)"
        )
    if not all(u.startswith(("http://", "https://")) for u in urls):
        raise ValueError(f"urls must start with http:// or https://, got {urls!r}")
    if temperature > _MAX_SERVER_TEMPERATURE:
        raise ValueError(
            f"temperature={temperature}: vLLM's server refuses temperatures above 2. "
            "Fix: temperature <= 2"
        )
    for name, value in (("request_timeout_s", request_timeout_s),
                        ("sync_timeout_s", sync_timeout_s)):  # fmt: skip
        if not 0 < value < float("inf"):
            raise ValueError(f"{name} must be > 0 seconds, got {value}")
    if push not in PUSH_BACKENDS:
        raise ValueError(f"push={push!r} is not known. Fix: push: {' or '.join(PUSH_BACKENDS)}")


def preflight(client: ServerClient, model: str | None) -> str:
    """Check that ``client``'s server answers, runs vLLM >= 0.32 with the RL endpoints, serves
    ``model`` (None: any; returns the served id) and reports tempered log-probs; raises
    :class:`ServerError` naming the fix."""
    served = client.models()
    if model is not None and model not in served:
        raise ServerError(
            f"vLLM server {client.url} serves {served}, not {model!r}. Fix: start it with that "
            "model (or --served-model-name), or set the engine's model to the served id"
        )
    found = client.version()
    if tuple(int(p) for p in found.split(".")[:2] if p.isdigit()) < (0, 32):
        raise ServerError(f"vLLM server {client.url} runs vLLM {found}. Fix: vLLM >= 0.32")
    client.is_paused()  # the RL endpoints exist (VLLM_SERVER_DEV_MODE=1)
    if not client.has_extension():
        raise ServerError(
            f"vLLM server {client.url} runs without lit-rlhf's worker extension (the weight "
            f"push needs it). Fix: start it with --worker-extension-cls {WORKER_EXTENSION} "
            "(lit-rlhf installed where the server runs)"
        )
    if _reports_raw_log_probs(client, model or served[0]):
        raise ServerError(
            f"vLLM server {client.url} reports raw log-probs (before temperature). Fix: start it "
            "with --logprobs-mode processed_logprobs"
        )
    return model or served[0]


def _reports_raw_log_probs(client: ServerClient, model: str) -> bool:
    """Sample one token of a fixed prompt at temperatures 1 and 0.5 with the same seed (on the
    OpenAI completions endpoint, so that the server's request log tells probes from rollouts):
    raw log-probs are the same for the same token, tempered ones differ."""
    for seed in range(8):
        a, b = (
            client.call("POST", "/v1/completions", json={
                "model": model, "prompt": [1, 2, 3, 4], "max_tokens": 1, "seed": seed,
                "temperature": temperature, "logprobs": 0, "ignore_eos": True,
            })["choices"][0]["logprobs"]
            for temperature in (1.0, 0.5)
        )  # fmt: skip
        if a["tokens"] == b["tokens"]:
            return abs(a["token_logprobs"][0] - b["token_logprobs"][0]) < 1e-6
    return False


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


__all__ = ["VLLMServerEngine", "preflight"]
