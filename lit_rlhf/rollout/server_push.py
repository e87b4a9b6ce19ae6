"""How :class:`~lit_rlhf.rollout.server.VLLMServerEngine` moves the policy's weights into running
``vllm serve`` processes.

Both backends walk the weights in buckets of whole decoder blocks
(:func:`~lit_rlhf.rollout.weight_sync.weight_buckets`: under ZeRO-3 every rank gathers each
bucket once, copies it out and releases it before anything is sent). Under full fine-tuning every
block is sent; with LoRA or frozen parts only the blocks that changed (a copy of the served
weights on the CPU tells which).

- ``disk`` (runs on CPU; tested): rank 0 writes each bucket as a safetensors file into a fresh
  folder, then for every server: ``/pause?mode=keep`` (requests in flight freeze), ``/collective_rpc
  reload_weights(weights_path=folder)``, ``/reset_prefix_cache``, ``/update_weight_version``,
  ``/resume``. The folder must be readable where the servers run (same machine, shared file
  system); the previous push's folder is deleted after the servers load the new one.
- ``nccl`` (GPU servers; NOT verified here: no GPU machine with vLLM was available): vLLM's own
  trainer-side NCCL transfer (``vllm.distributed.weight_transfer``): rank 0 opens an NCCL group
  with each server's workers (rendezvous on this host, a free port) and broadcasts the buckets
  between ``start_weight_update`` and ``finish_weight_update(version)``, inside pause/resume.
  The servers need ``--weight-transfer-config '{"backend": "nccl"}'``.

A push runs in a thread with ``sync_timeout_s`` as its deadline (a raw NCCL call has none); past
it a ``TimeoutError`` names the step it was stuck in.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_rlhf.rollout import weight_sync
from lit_rlhf.rollout.server_client import ServerClient, ServerError
from lit_rlhf.rollout.vllm import resolve_engine_dtype
from lit_rlhf.rollout.weight_sync import WeightSnapshot, run_with_deadline

PUSH_BACKENDS = ("disk", "nccl")


class _Push:
    """What both backends share: the change test, the deadline and the phase for messages."""

    def __init__(self, clients: list[ServerClient], bucket_bytes: int, timeout_s: float) -> None:
        self.clients = clients
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.snapshot: WeightSnapshot | None = None
        self.phase = "idle"

    def push(self, model: nn.Module, label: str, *, dtype: str, full: bool, rank: int) -> int:
        """Send ``model``'s weights labelled ``label``; the bytes sent (0 on other ranks)."""
        engine_dtype = resolve_engine_dtype(dtype, next(model.parameters()))
        if weight_sync.is_full_update(model):
            self.snapshot = None
        elif full or self.snapshot is None:
            self.snapshot = WeightSnapshot("cpu")  # empty: every block counts as changed

        def run() -> int:
            return self._send(model, label, engine_dtype, rank)

        try:
            return run_with_deadline(run, self.timeout_s, lambda: self.phase)
        except TimeoutError as err:
            raise ServerError(
                f"the weight push to {[c.url for c in self.clients]} {err}. Fix: check the "
                "servers (their logs), or raise the engine's sync_timeout_s for a large model"
            ) from None

    def buckets(self, model: nn.Module, dtype: torch.dtype) -> Any:
        return weight_sync.weight_buckets(
            model, budget_bytes=self.bucket_bytes, dtype=dtype, snapshot=self.snapshot,
            device="cpu", on_phase=self._set_phase,
        )  # fmt: skip

    def _set_phase(self, phase: str) -> None:
        self.phase = phase

    def _send(self, model: nn.Module, label: str, dtype: torch.dtype, rank: int) -> int:
        raise NotImplementedError

    def _each_server_paused(self, load: Any, label: str) -> None:
        """For every server: pause (keep), ``load(client)``, relabel, resume."""
        for client in self.clients:
            self.phase = f"pausing {client.url}"
            client.pause("keep")
            try:
                self.phase = f"loading the new weights into {client.url}"
                load(client)
                self.phase = f"labelling the weights of {client.url} {label!r}"
                client.set_weight_version(label)
            finally:
                self.phase = f"resuming {client.url}"
                client.resume()
        self.phase = "idle"

    def close(self) -> None:
        """Release what the backend holds (folders, communicators)."""


class DiskPush(_Push):
    """Safetensors files in a folder the servers can read; see the module docstring."""

    def __init__(
        self, clients: list[ServerClient], root: str | None, bucket_bytes: int, timeout_s: float
    ) -> None:
        super().__init__(clients, bucket_bytes, timeout_s)
        self.root = Path(root) if root else None
        self._own_root = root is None
        self.current: Path | None = None

    def _send(self, model: nn.Module, label: str, dtype: torch.dtype, rank: int) -> int:
        from safetensors.torch import save_file

        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="lit-rlhf-push-"))
        folder = self.root / f"v{label}"
        sent = 0
        for i, bucket in enumerate(self.buckets(model, dtype)):
            if rank != 0:
                continue  # every rank gathers; rank 0 writes
            folder.mkdir(parents=True, exist_ok=True)
            self.phase = f"writing bucket {i} ({len(bucket)} tensors) to {folder}"
            save_file(
                {n: t.contiguous() for n, t in bucket}, str(folder / f"model-{i:05d}.safetensors")
            )
            sent += sum(t.numel() * t.element_size() for _, t in bucket)
        if rank != 0:
            return 0

        def load(client: ServerClient) -> None:
            if sent:
                client.reload_weights(str(folder))
                client.reset_prefix_cache()

        self._each_server_paused(load, label)
        if self.current is not None and self.current != folder:
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = folder if sent else self.current
        return sent

    def close(self) -> None:
        if self._own_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


class NCCLPush(_Push):
    """vLLM's NCCL weight transfer (GPU servers; not verified here); see the module docstring."""

    def __init__(self, clients: list[ServerClient], bucket_bytes: int, timeout_s: float) -> None:
        super().__init__(clients, bucket_bytes, timeout_s)
        self.senders: list[Any] = []

    def _send(self, model: nn.Module, label: str, dtype: torch.dtype, rank: int) -> int:
        tensors = [pair for bucket in self.buckets(model, dtype) for pair in bucket]
        if rank != 0:
            return 0
        moved = [(n, t.cuda(non_blocking=True)) for n, t in tensors]
        if not self.senders:
            self.senders = [self._connect(c, moved) for c in self.clients]

        def load(client: ServerClient) -> None:
            sender = self.senders[self.clients.index(client)]
            sender.source.pairs = moved
            sender.send_weights()

        self._each_server_paused(load, label)
        return sum(t.numel() * t.element_size() for _, t in moved)

    def _connect(self, client: ServerClient, pairs: list[Any]) -> Any:
        try:
            from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
            from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
            from vllm.distributed.weight_transfer.nccl_engine import (
                NCCLTrainerInitInfo,
                NCCLTrainerWeightTransferEngine,
            )
        except ImportError as err:
            raise ServerError(
                "push: nccl needs vLLM >= 0.32 installed beside the trainer. Fix: pip install "
                "vllm, or push: disk"
            ) from err

        class Pairs(WeightSource):
            def __init__(self, pairs: list[Any]) -> None:
                self.pairs = pairs

            def metadata(self) -> list[Any]:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.pairs]

            def __iter__(self) -> Any:
                return iter(self.pairs)

        workers = int(client.call("GET", "/get_world_size")["world_size"])
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        info = NCCLTrainerInitInfo(
            master_address=socket.gethostbyname(socket.gethostname()), master_port=port,
            world_size=workers + 1, rank=0,
        )  # fmt: skip
        sync = HTTPVLLMWeightSyncClient(client.url, timeout=self.timeout_s)
        return NCCLTrainerWeightTransferEngine.trainer_init(info, client=sync, source=Pairs(pairs))


def make_push(
    kind: str, clients: list[ServerClient], push_dir: str | None, bucket_bytes: int,
    timeout_s: float,
) -> _Push:  # fmt: skip
    """The push backend ``kind`` (one of :data:`PUSH_BACKENDS`)."""
    if kind == "disk":
        return DiskPush(clients, push_dir, bucket_bytes, timeout_s)
    return NCCLPush(clients, bucket_bytes, timeout_s)


__all__ = ["PUSH_BACKENDS", "DiskPush", "NCCLPush", "make_push"]
