"""One optimizer step from micro-batch losses, the same under one process, DDP and DeepSpeed.

Every module with manual optimisation (PPO, the generative reward model, the compressor) calls
:class:`OptimizerStep` instead of writing its own backward / clip / step, because each of those is
easy to get silently wrong under DeepSpeed (see ``lit_rlhf.strategies.deepspeed_hooks``):

    zero_grad -> for each micro-batch: mark it (DeepSpeed) and ``manual_backward(loss)`` (under
              DDP inside ``no_sync`` but the last, so gradients are all-reduced once per step)
              (or, with a per-task gradient callback such as MGS: the backward task by task,
              combined by the callback; ``lit_rlhf.training.task_backward``)
              -> gradient hooks (callbacks may read / rewrite the reduced gradients)
              -> gradient norm + clipping (DeepSpeed: its own, inside its step)
              -> each param group's lr set by the schedule (:mod:`lit_rlhf.training.lr_schedule`)
              -> ``optimizer.step()``, or a skip when the loss or gradient is not finite

Exact accumulation is the caller's part: each micro-batch loss must already be scaled so that
the sum over micro-batches equals the mini-batch loss (``aggregate_loss(num_tokens=...)``).

Non-finite steps (:mod:`lit_rlhf.training.faults`): a non-finite micro-batch loss is made to
poison its gradient, so one check decides: the total norm of the reduced gradient, after the
hooks. Plain / DDP: the ranks agree explicitly (``reduce_boolean_decision``; DDP has averaged the
gradients, so a NaN reached every rank anyway), and on a skip the gradients are zeroed and
``optimizer.step()`` is not called: weights, optimizer state and ``trainer.global_step`` stay as
they were. DeepSpeed ZeRO-1/2/3: the norm exists only inside DeepSpeed's step, which finds it
non-finite, skips on every rank together and clears its gradient partitions; the skip is read
back from ``engine.was_step_applied()`` (``trainer.global_step`` still advances there). Under
float16 loss scaling (Lightning's GradScaler, DeepSpeed fp16) overflow skips belong to the scaler,
which lowers its scale: they are neither counted nor fatal. Every step returns
``fault/skipped_steps`` (cumulative); ``max_consecutive_skips`` skips in a row stop the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

import torch
from lightning import LightningModule
from lightning.pytorch.strategies import FSDPStrategy
from torch import Tensor
from torch.distributed.tensor import DTensor

from lit_rlhf.settings import OptimSettings
from lit_rlhf.strategies import (
    deepspeed_grad_norm,
    is_deepspeed,
    set_deepspeed_gradient_clipping,
    start_micro_batch,
)
from lit_rlhf.training.faults import LossWatch, NonFiniteSkips, deepspeed_step_skipped
from lit_rlhf.training.gradients import Gradients
from lit_rlhf.training.lr_schedule import LR_KEY, LRSchedule
from lit_rlhf.training.protocols import gradient_hooks, task_gradient_hook
from lit_rlhf.training.task_backward import task_backward

MicroBatch = TypeVar("MicroBatch")


CHECKPOINT_KEY = "lit_rlhf_optimizer_step"  # where save_to / load_from keep the counters


class OptimizerStep:
    """Backward over micro-batches, gradient hooks, clipping and the step.

    Args:
        max_grad_norm: clip the total gradient norm to this value (None: no clipping). Under
            DeepSpeed it becomes the config's ``gradient_clipping``: call :meth:`configure`
            from ``configure_model``, before DeepSpeed reads its config.
        norm_key: the key under which the gradient norm (before clipping) is returned.
        max_consecutive_skips: steps with a non-finite loss or gradient are skipped; this many
            in a row stop the run with a FloatingPointError (1: stop at the first).
        lr_schedule: the ``optim`` group whose lr schedule is applied before every step (None:
            constant, each group's own lr); its counters are in :meth:`state_dict`. The lr is
            returned as ``train/lr``.
        clip_grad_per_group: clip each param group's gradient norm to ``max_grad_norm`` on its
            own instead of the joint norm of all groups (verl's two optimizers, one per network);
            each group's norm before clipping is returned too, as ``<norm_key>/<group name>``
            (the group's ``"name"``, else its index). Refused under DeepSpeed and FSDP (they clip
            the global norm of sharded gradients) and under float16 loss scaling (Lightning
            unscales inside the step, after the clip): see :meth:`check_strategy`.
        lr_idle_batches: training batches without an optimizer step, left out of the lr
            schedule's derived total (:class:`~lit_rlhf.training.lr_schedule.LRSchedule`).
    """

    def __init__(
        self,
        *,
        max_grad_norm: float | None,
        norm_key: str = "train/grad_norm",
        max_consecutive_skips: int = 5,
        lr_schedule: OptimSettings | None = None,
        clip_grad_per_group: bool = False,
        lr_idle_batches: int = 0,
    ) -> None:
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(
                f"max_grad_norm must be > 0 or None (no clipping), got {max_grad_norm}"
            )
        self.max_grad_norm = max_grad_norm
        self.optim = OptimSettings(max_grad_norm=max_grad_norm)
        self.norm_key = norm_key
        self.skips = NonFiniteSkips(max_consecutive_skips)
        self.lr = LRSchedule(lr_schedule, idle_batches=lr_idle_batches)
        self.clip_grad_per_group = clip_grad_per_group

    @classmethod
    def from_settings(
        cls, optim: OptimSettings, *, norm_key: str = "train/grad_norm", lr_idle_batches: int = 0
    ) -> OptimizerStep:
        """The step a module's ``optim`` group describes (clipping, skips, lr schedule)."""
        step = cls(
            max_grad_norm=optim.max_grad_norm,
            norm_key=norm_key,
            max_consecutive_skips=optim.max_consecutive_skips,
            lr_schedule=optim,
            clip_grad_per_group=optim.clip_per_network,
            lr_idle_batches=lr_idle_batches,
        )
        step.optim = optim
        return step

    def adamw(self, params: Any) -> torch.optim.AdamW:
        """AdamW over ``params`` (tensors, or param groups that may carry their own ``lr``) with
        the ``optim`` group's lr and weight decay."""
        return torch.optim.AdamW(params, lr=self.optim.lr, weight_decay=self.optim.weight_decay)

    def configure(self, strategy: Any) -> None:
        """Check the strategy (:meth:`check_strategy`) and hand the clipping norm to DeepSpeed
        (a no-op for other strategies)."""
        self.check_strategy(strategy)
        set_deepspeed_gradient_clipping(strategy, self.max_grad_norm)

    def check_strategy(self, strategy: Any) -> None:
        """Refuse clipping where it would act on scaled gradients (float16 loss scaling under
        manual optimisation: the scaler unscales inside ``optimizer.step()``, after the clip), and
        per-group clipping where it cannot be done: DeepSpeed clips the global norm inside its
        own step, and FSDP's gradients are shards (a per-group norm would be one rank's)."""
        if strategy is None:
            return
        scaler = getattr(getattr(strategy, "precision_plugin", None), "scaler", None)
        if scaler is not None and self.max_grad_norm is not None and not is_deepspeed(strategy):
            raise ValueError(
                "trainer.precision: 16-mixed with max_grad_norm: under manual optimisation "
                "Lightning's loss scaler unscales the gradients only inside optimizer.step(), "
                "after the clip, so the clip would act on gradients multiplied by the loss scale "
                "(and the logged norm would be the scaled one). Fix: trainer.precision: "
                "bf16-mixed (no loss scaler) or 32-true, or model.init_args.optim.max_grad_norm: "
                "null."
            )
        if not self.clip_grad_per_group:
            return
        why = None
        if is_deepspeed(strategy):
            why = "DeepSpeed clips the global gradient norm inside its own step"
        elif isinstance(strategy, FSDPStrategy):
            why = "FSDP's gradients are shards, so a group's norm would be one rank's"
        if why is not None:
            raise ValueError(
                "per-network / per-group gradient clipping (optim.clip_per_network) cannot run "
                f"under {type(strategy).__name__} with precision "
                f"{type(strategy.precision_plugin).__name__}: {why}. Fix: set "
                "model.init_args.optim.clip_per_network: false (the joint norm is clipped), or "
                "drop the DeepSpeed / FSDP strategy."
            )

    def __call__(
        self,
        module: LightningModule,
        optimizer: Any,
        micro_batches: Sequence[MicroBatch],
        loss_fn: Callable[[MicroBatch], Tensor],
        task_of: Callable[[MicroBatch], str] | None = None,
        *,
        step_in_batch: tuple[int, int] = (0, 1),
    ) -> dict[str, Tensor]:
        """Take one optimizer step on the summed gradients of ``loss_fn`` over ``micro_batches``.
        Returns the hooks' diagnostics, the gradient norm before clipping and
        ``fault/skipped_steps``; the step is skipped when the loss or gradient is not finite.

        ``task_of`` names each micro-batch's task (domain; a micro-batch holds one task): with a
        :class:`~lit_rlhf.training.protocols.TaskGradientHook` callback (MGS) the backward runs
        task by task and the callback combines the per-task gradients
        (:mod:`lit_rlhf.training.task_backward`).

        ``step_in_batch``: (this step's index, the number of optimizer steps of the training
        batch), for the lr schedule's ``lr_interval: batch`` (default: one step per batch)."""
        if not micro_batches:
            raise ValueError("an optimizer step needs at least one micro-batch")
        strategy = module.trainer.strategy
        self.check_strategy(strategy)
        watch = LossWatch(loss_fn)
        stats = self._backward(module, optimizer, micro_batches, watch, task_of)
        stats.update(gradient_hooks(module.trainer, module, Gradients(module, strategy)))
        stats[LR_KEY] = torch.tensor(self.lr.apply(module.trainer, optimizer, step_in_batch))
        if is_deepspeed(strategy):
            # DeepSpeed clips inside its step; under ZeRO the gradients are not in param.grad,
            # so the norm is the one DeepSpeed computed there, and so is the skip decision
            optimizer.step()
            norm = deepspeed_grad_norm(strategy)
            skipped = deepspeed_step_skipped(strategy, norm)
        else:
            norm, skipped = self._clip_and_step(module, optimizer)
            if self.clip_grad_per_group:
                stats.update(self._group_norms)
        if skipped is not None:
            what = watch.what() if skipped else ""
            self.skips.record(skipped, step=module.trainer.global_step, what=what)
        if norm is not None:
            stats[self.norm_key] = norm
        return {**stats, **self.skips.stats()}

    def _backward(
        self,
        module: LightningModule,
        optimizer: Any,
        micro_batches: Sequence[MicroBatch],
        loss_fn: Callable[[MicroBatch], Tensor],
        task_of: Callable[[MicroBatch], str] | None,
    ) -> dict[str, Tensor]:
        """The summed gradient of all micro-batches (per task with a TaskGradientHook)."""
        strategy = module.trainer.strategy
        hook = task_gradient_hook(module.trainer)
        if hook is not None:
            if task_of is None:
                raise ValueError(
                    f"{type(hook).__name__} needs each micro-batch's task, and "
                    f"{type(module).__name__} does not give OptimizerStep a task_of. Fix: pass "
                    "task_of= (and keep one task per micro-batch), or remove the callback."
                )
            return task_backward(module, optimizer, micro_batches, loss_fn, task_of, hook)
        optimizer.zero_grad()
        # DDP's no_sync (DeepSpeed keeps its own accumulation boundary: start_micro_batch)
        block_sync = (
            None if is_deepspeed(strategy) else getattr(strategy, "block_backward_sync", None)
        )
        for i, micro in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            # under DeepSpeed, micro-batches bypass the engine's forward (no-op elsewhere)
            start_micro_batch(strategy, last=last)
            # under DDP, only the last micro-batch's backward all-reduces (the summed gradient)
            with nullcontext() if last or not callable(block_sync) else block_sync():
                module.manual_backward(loss_fn(micro))
        return {}

    def _clip_and_step(
        self, module: LightningModule, optimizer: Any
    ) -> tuple[Tensor | None, bool | None]:
        """(norm before clipping, whether the step was skipped; None: the loss scaler decides)."""
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        norm = full_norm(torch.nn.utils.get_total_norm(grads)) if grads else None
        self._group_norms: dict[str, Tensor] = {}
        if getattr(module.trainer.precision_plugin, "scaler", None) is not None:
            self._clip(module, optimizer)
            optimizer.step()  # float16 AMP: the GradScaler skips overflowing steps itself
            return norm, None
        bad = norm is not None and not bool(torch.isfinite(norm))
        if module.trainer.strategy.reduce_boolean_decision(bad, all=False):
            optimizer.zero_grad()
            return norm, True
        self._clip(module, optimizer)
        optimizer.step()
        return norm, False

    def _clip(self, module: LightningModule, optimizer: Any) -> None:
        """Clip the total gradient norm through Lightning (strategy-aware), or with
        ``clip_grad_per_group`` each param group's norm on its own (norms kept for the stats)."""
        if self.clip_grad_per_group:
            self._clip_per_group(optimizer)
        elif self.max_grad_norm is not None:
            module.clip_gradients(
                optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm"
            )

    def _clip_per_group(self, optimizer: Any) -> None:
        """Each param group's gradient clipped to ``max_grad_norm`` on its own, as separate
        optimizers would (verl: ``clip_grad_norm_`` on the actor, then on the critic)."""
        for i, group in enumerate(optimizer.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if self.max_grad_norm is None:
                norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            else:
                norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            self._group_norms[f"{self.norm_key}/{group.get('name', i)}"] = full_norm(norm)

    def state_dict(self) -> dict[str, Any]:
        """The skip counters (``fault/skipped_steps``, consecutive skips) and the lr schedule's
        counters, for checkpoints."""
        return {**self.skips.state_dict(), "lr_schedule": self.lr.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skips.load_state_dict(state)
        self.lr.load_state_dict(state.get("lr_schedule", {}))

    def save_to(self, checkpoint: dict[str, Any]) -> None:
        """``on_save_checkpoint`` of a module that keeps no other lit-rlhf state: the counters
        under their own top-level key."""
        checkpoint[CHECKPOINT_KEY] = self.state_dict()

    def load_from(self, checkpoint: dict[str, Any]) -> None:
        """The reverse of :meth:`save_to` (a checkpoint without the key: counters at 0)."""
        self.load_state_dict(checkpoint.get(CHECKPOINT_KEY, {}))


def full_norm(norm: Tensor) -> Tensor:
    """A gradient norm as a plain tensor: under FSDP2 the gradients are DTensor shards and
    torch's norm of them a DTensor (already reduced over the shards), gathered here for the
    non-finite check and the logs."""
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return norm.detach()
