"""One PPO run under a chosen strategy, for the distributed tests. They run it in a subprocess
from the repository root: Lightning's ddp launcher re-runs this command line once per extra
process.

    python -m tests.distributed.run_ppo KIND DEVICES STEPS OUT.json [--epochs N]
        [--engine fixed|hf] [--save-checkpoint DIR] [--resume DIR] [--model M]
        [--micro-batch-size M] [--clip-per-network] [--module ppo|grm] [--kill-in-save]

KIND: ``plain`` (no strategy), ``ddp``, ``zero2``, ``zero3`` (the CPU DeepSpeed subclass),
``fsdp2`` (FSDP2Strategy on gloo).
STEPS: rollouts per epoch. Every rollout takes ``GLOBAL_PROMPTS`` prompts in all, split evenly
over the processes (per-process batch = GLOBAL_PROMPTS / DEVICES), so 1 and 2 processes see the
same prompts per rollout. Writes OUT.json (counters, per-rollout grad norms; rank 0) and, on
every rank, OUT.init.rank<r>.pt and OUT.epoch<e>.rank<r>.pt (every trainable weight, gathered in
full under ZeRO-3) at the start and after each epoch. ``--kill-in-save``: the process kills
itself (SIGKILL) right after DCP has written the shards of ``--save-checkpoint``, before the
folder is put in place.

Why the runs are comparable across process counts (``--engine fixed``): the engine returns
responses that depend only on the prompt and the sample index (seeded by a hash of both), all of
the same length with no EOS. Every rank then holds the same number of response tokens, so the
average of per-rank token means (DDP / DeepSpeed gradient averaging) equals the token mean over
all ranks (the single process); GAE without whitening and the critic are per-sequence; and the
single process walks the prompts in the order Lightning's DistributedSampler deals them to the
ranks (see ``main``). Gradients agree up to float summation order.
"""

from __future__ import annotations

import argparse
import json
import os
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, DistributedSampler

from lit_rlhf.callbacks import TrustRegionEntropy
from lit_rlhf.models import load_tokenizer, resolve
from lit_rlhf.models.forward import forward_response
from lit_rlhf.modules import GenerativeRewardModule, PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.strategies import CPUDeepSpeedStrategy, FSDP2Strategy, shutdown_distributed
from lit_rlhf.types import GenerationOutput, RewardOutput
from tests.helpers import prompt_loader

GLOBAL_PROMPTS = 4
RESPONSE_LENGTH = 6
FIRST_PLAIN_TOKEN = 6  # the tiny tokenizer's ids 0-5 are special tokens (pad, EOS, roles)


class FixedResponseEngine:
    """Responses seeded by (prompt tokens, sample index): identical whatever the batch holds."""

    temperature = 1.0

    @torch.no_grad()
    def generate(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        tokenizer: Any,
        *,
        greedy: bool,
        log_probs: bool = True,
    ) -> GenerationOutput:
        seen: Counter[tuple[int, ...]] = Counter()
        rows = []
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            key = tuple(ids[mask.bool()].tolist())
            seed = zlib.crc32(repr((key, seen[key])).encode())
            seen[key] += 1
            gen = torch.Generator().manual_seed(seed)
            rows.append(
                torch.randint(FIRST_PLAIN_TOKEN, len(tokenizer), (RESPONSE_LENGTH,), generator=gen)
            )
        response = torch.stack(rows).to(input_ids.device)
        response_mask = torch.ones_like(response, dtype=torch.bool)
        chosen = forward_response(  # computed even if not asked for (the protocol allows it)
            model,
            torch.cat([input_ids, response], dim=1),
            torch.cat([attention_mask.bool(), response_mask], dim=1),
            response,
            temperature=self.temperature,
        ).log_probs
        return GenerationOutput(response, response_mask, chosen)

    def sync_weights(self, model: Any) -> None:
        pass


class DigitShareReward:
    """Share of digits among the non-space characters: varies across random responses."""

    def __call__(self, prompts: Any, completions: Any, rows: Any) -> RewardOutput:
        return RewardOutput(
            torch.tensor(
                [sum(c.isdigit() for c in x) / max(1, len(x.replace(" ", ""))) for x in completions]
            )
        )


class GradNormLog(L.Callback):
    """Collects the logged ``ppo/grad_norm`` (mean over the rollout's optimizer steps)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        for key in ("ppo/grad_norm", "grm/grad_norm"):
            if key in trainer.callback_metrics:
                self.values.append(float(trainer.callback_metrics[key]))


class SaveWeights(L.Callback):
    """Writes every trainable weight in full at the start and after each epoch, on every rank:
    ``OUT.init.rank<r>.pt``, ``OUT.epoch<e>.rank<r>.pt``."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._save(trainer, pl_module, "init")

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._save(trainer, pl_module, f"epoch{trainer.current_epoch}")

    def _save(self, trainer: Any, module: Any, tag: str) -> None:
        torch.save(full_weights(trainer, module), f"{self.out}.{tag}.rank{trainer.global_rank}.pt")


def strategy_for(kind: str) -> Any:
    if kind == "plain":
        return "auto"
    if kind == "ddp":
        return "ddp"
    if kind == "fsdp2":
        return FSDP2Strategy()
    return CPUDeepSpeedStrategy(stage={"zero2": 2, "zero3": 3}[kind])


def full_weights(trainer: L.Trainer, module: PPOModule) -> dict[str, torch.Tensor]:
    """Every trainable parameter in full (ZeRO-3 gathers the partitions on every rank, FSDP2's
    DTensors gather with ``full_tensor``)."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if any(isinstance(p, DTensor) for _, p in params):
        return {n: p.detach().full_tensor().clone() for n, p in params}
    if getattr(trainer.strategy, "zero_stage_3", False):
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in params]):
            return {n: p.detach().clone() for n, p in params}
    return {n: p.detach().clone() for n, p in params}


def policy_elements(module: Any) -> dict[str, Any]:
    """How many of the policy's parameter elements this rank holds, of how many, and whether
    every parameter is a DTensor (FSDP2)."""
    params = list(module.policy.parameters())
    local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
    return {
        "policy_local_elements": sum(p.numel() for p in local),
        "policy_elements": sum(p.numel() for p in params),
        "policy_all_dtensors": all(isinstance(p, DTensor) for p in params),
    }


def build_module(args: Any, model_dir: Any, tokenizer: Any, engine: Any) -> Any:
    """PPO with a separate critic (``--module ppo``) or the generative reward model trained with
    GRPO on the same rollouts (``--module grm``), both with a frozen reference."""
    optim = {
        "micro_batch_size": args.micro_batch_size,  # 2: several backward passes per step
        "lr": 1e-3,
        "max_grad_norm": 0.2,
    }
    if args.module == "grm":
        return GenerativeRewardModule(
            mode="rft",
            reward=DigitShareReward(),  # instead of verdicts: varies across random responses
            model=model_dir,
            tokenizer=tokenizer,
            engine=engine,
            rollout={"samples_per_prompt": 2},
            update={"ppo_epochs": 2},
            optim=optim,
            kl={"coef": 0.05},
        )
    return PPOModule(
        reward=DigitShareReward(),
        model=model_dir,
        tokenizer=tokenizer,
        engine=engine,
        rollout={"samples_per_prompt": 2},
        advantage={
            "estimator": "gae",
            "whiten": False,
        },  # a separate critic: two param groups with different learning rates
        update={
            "ppo_epochs": 2
        },  # the second epoch's ratio is not 1: clipping and old log-probs matter
        optim={**optim, "clip_per_network": args.clip_per_network},
        kl={"coef": 0.05},  # a frozen reference model under the strategy too
        critic={"lr": 3e-3},  # below most norms here: clipping is active
    )


def kill_after_dcp_write() -> None:
    """Make the next distributed-checkpoint save SIGKILL this process once its shards are on
    disk (Lightning's module-level save function, called by ModelParallelStrategy)."""
    import signal

    import lightning.pytorch.strategies.model_parallel as model_parallel

    write = model_parallel._distributed_checkpoint_save

    def write_then_die(state: Any, path: Any) -> None:
        write(state, path)
        os.kill(os.getpid(), signal.SIGKILL)

    model_parallel._distributed_checkpoint_save = write_then_die


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["plain", "ddp", "zero2", "zero3", "fsdp2"])
    parser.add_argument("devices", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--engine", choices=["fixed", "hf"], default="fixed")
    parser.add_argument("--save-checkpoint")
    parser.add_argument("--resume")
    parser.add_argument("--model", default="builtin:tiny-llama")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--clip-per-network", action="store_true")
    parser.add_argument("--module", choices=["ppo", "grm"], default="ppo")
    parser.add_argument("--kill-in-save", action="store_true")
    args = parser.parse_args()
    if args.kill_in_save:
        kill_after_dcp_write()
    torch.set_num_threads(1)  # two processes on two cores
    L.seed_everything(0, verbose=False)

    model_dir = resolve(args.model)
    tokenizer = load_tokenizer(model_dir)
    engine = FixedResponseEngine() if args.engine == "fixed" else HFGenerationEngine(8)
    module = build_module(args, model_dir, tokenizer, engine)
    prompts = [
        f"Using the numbers [{i}, {i + 3}, {2 * i}]" for i in range(GLOBAL_PROMPTS * args.steps)
    ]
    loader = prompt_loader(tokenizer, prompts, GLOBAL_PROMPTS // args.devices)
    if args.devices == 1:
        # Lightning gives every multi-process training loader a shuffling DistributedSampler
        # (seed PL_GLOBAL_SEED = 0); rank r takes positions r, r + 2, ... of the epoch's
        # permutation, which does not depend on the number of replicas. One process walking that
        # permutation in batches of 4 therefore sees, in each batch, the union of both ranks'.
        sampler = DistributedSampler(prompts, num_replicas=1, rank=0, shuffle=True, seed=0)
        loader = DataLoader(prompts, GLOBAL_PROMPTS, sampler=sampler, collate_fn=loader.collate_fn)
    grad_norms = GradNormLog()
    tre = TrustRegionEntropy(alpha=0.01, k=2, schedule="linear", final_alpha=0.0, total_steps=100)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy_for(args.kind),
        max_epochs=args.epochs,
        callbacks=[tre, grad_norms, SaveWeights(args.out)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(Path(args.out).parent),
    )
    trainer.fit(module, loader, ckpt_path=args.resume)
    if args.save_checkpoint:
        trainer.save_checkpoint(args.save_checkpoint)

    if trainer.is_global_zero:
        summary = {
            "global_step": trainer.global_step,
            "rollout_step": module.rollout_step,
            "tre_steps": tre.coefficient.steps,
            "grad_norms": grad_norms.values,
            "world_size": trainer.world_size,
            "strategy": type(trainer.strategy).__name__,
            **policy_elements(module),
        }
        Path(args.out).write_text(json.dumps(summary))
    shutdown_distributed()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
