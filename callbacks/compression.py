"""Faithfulness diagnostics of a context compressor at validation (the "size-fidelity paradox",
arXiv 2602.09789): effective rank of the memory, the decoder's teacher-forced token entropy,
reconstruction fidelity, and the knowledge-overwriting and semantic-drift probes.

It works with any LightningModule whose ``validation_step`` returns a dict with some of:

    memory           [B, k, d] memory vectors          -> effective rank (per sample, pooled)
    logits, logits_mask  [B, T, V], [B, T] bool        -> mean token entropy (nats)
    reconstructions, references   list[str] each       -> exact match, token F1, ROUGE-L, BLEU

and, for the probes, a ``reconstruct(texts: list[str]) -> list[str]`` method (compress each text
and decode it back). :class:`~lit_rlhf.modules.CompressorDecoderModule` provides both. Logged at
the end of each validation epoch under ``val/``: ``effective_rank``, ``pooled_effective_rank``,
``decoder_entropy``, ``exact_match``, ``token_f1``, ``rougeL``, ``bleu`` and, with probes,
``probe/<kind>/<outcome>`` (e.g. ``probe/overwrite/overwritten``, ``probe/role/drifted``).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning import Callback
from typing_extensions import override

from lit_rlhf.data.probes import make_probes, probe_rates
from lit_rlhf.metrics.fidelity import EffectiveRank, MeanTokenEntropy, ReconstructionFidelity


class CompressionDiagnostics(Callback):
    """Args:
    probes: probe items per kind (``overwrite`` and ``drift``) run at the end of each validation
        epoch (0: none); the same items every epoch (seeded by ``probe_seed``).
    probe_seed: the probe generators' seed.
    max_vectors: memory rows kept per process for the pooled effective rank.
    """

    def __init__(self, probes: int = 12, probe_seed: int = 0, max_vectors: int = 2048) -> None:
        if probes < 0:
            raise ValueError(f"probes must be >= 0 (0: no probes), got {probes}")
        self.probe_items = (
            make_probes("overwrite", probes, seed=probe_seed)
            + make_probes("drift", probes, seed=probe_seed)
            if probes
            else []
        )
        self.erank = EffectiveRank(max_vectors=max_vectors)
        self.entropy = MeanTokenEntropy()
        self.fidelity = ReconstructionFidelity()
        self._seen: set[str] = set()

    @override
    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for metric in (self.erank, self.entropy, self.fidelity):
            metric.to(pl_module.device)
            metric.reset()
        self._seen = set()

    @override
    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if not isinstance(outputs, dict):
            return
        if "memory" in outputs:
            self.erank.update(outputs["memory"].float())
            self._seen.add("memory")
        if "logits" in outputs:
            self.entropy.update(outputs["logits"], outputs["logits_mask"])
            self._seen.add("logits")
        if "reconstructions" in outputs:
            self.fidelity.update(outputs["reconstructions"], outputs["references"])
            self._seen.add("reconstructions")

    @override
    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        logged: dict[str, Any] = {}
        if "memory" in self._seen:
            logged.update({f"val/{k}": v for k, v in self.erank.compute().items()})
        if "logits" in self._seen:
            logged["val/decoder_entropy"] = self.entropy.compute()
        if "reconstructions" in self._seen:
            logged.update({f"val/{k}": v for k, v in self.fidelity.compute().items()})
        if self.probe_items and callable(getattr(pl_module, "reconstruct", None)):
            texts = pl_module.reconstruct([item["context"] for item in self.probe_items])
            rates = probe_rates(self.probe_items, texts)
            logged.update({f"val/probe/{k}": torch.tensor(v) for k, v in rates.items()})
        if logged:
            # the same on every rank (the metrics reduce across ranks, every rank probes the
            # same weights): sync_dist keeps them; on the module's device, which NCCL needs
            device = pl_module.device
            values = {k: torch.as_tensor(v, device=device).float() for k, v in logged.items()}
            pl_module.log_dict(values, sync_dist=True)
