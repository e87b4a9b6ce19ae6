"""What the policy wrote: a table of prompts, completions and rewards every N rollout steps.

``rollout.log_completions: N`` (PPOModule) makes every N-th rollout step return its samples as
rows (:func:`completion_rows`) in the training step's output under ``"completions"``;
:class:`CompletionTable`, a callback every lit-rlhf module installs, writes any such rows:

- to ``completions.jsonl`` in the first logger's folder (beside ``metrics.csv``; the trainer's
  ``default_root_dir`` without a logger), one JSON object per sample; ranks other than 0 write
  ``completions.rank<r>.jsonl`` (each rank samples its own prompts);
- to a W&B logger as the table ``completions`` (``WandbLogger.log_table``) and to an MLflow logger
  as ``completions/step_<step>.json`` (``MlflowClient.log_table``), rank 0's rows;
- one sample (the first of the step) to the console.

A row: ``rollout_step``, ``global_step``, ``sample`` (index in the step), ``query_id``, ``task``,
``prompt``, ``completion``, ``reward`` (the score the update used: the reward plus the reward
terms), each part of the reward's info (``reward/<part>``; None where a part is not defined for
the sample), ``advantage`` (at the first response token) and, for multi-turn episodes, ``turns``
(the environment's reward per turn taken). The mean of a step's ``reward`` column is the step's
logged ``reward/mean`` when no reward failed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from lit_rlhf.types import Experience

KEY = "completions"
_CONSOLE_CHARS = 300


def completion_rows(experience: Experience, rollout_step: int, global_step: int) -> list[dict]:
    """One row per sample of ``experience`` (see the module docstring)."""
    rollout = experience.rollout
    scores = rollout.scores.detach().float().cpu().tolist()
    parts = {k: v.detach().float().cpu().tolist() for k, v in rollout.reward_info.items()}
    mask = rollout.response_mask if rollout.agent_mask is None else rollout.agent_mask
    first = mask.float().argmax(dim=1)  # the first response (agent) token of each sample
    advantages = experience.advantages.gather(1, first[:, None].to(experience.advantages.device))
    rows = []
    for i, completion in enumerate(rollout.responses):
        row: dict[str, Any] = {
            "rollout_step": rollout_step,
            "global_step": global_step,
            "sample": i,
            "query_id": rollout.query_ids[i],
            "task": rollout.tasks[i],
            "prompt": rollout.prompts[i],
            "completion": completion,
            "reward": scores[i],
        }
        row.update({f"reward/{k}": _number(v[i]) for k, v in parts.items()})
        row["advantage"] = float(advantages[i, 0])
        if rollout.turn_rewards is not None and rollout.turn_ends is not None:
            taken = rollout.turn_ends[i] >= 0
            row["turns"] = rollout.turn_rewards[i][taken.to(rollout.turn_rewards.device)].tolist()
        rows.append(row)
    return rows


def due_completions(out: dict, every: int, module: Any, experience: Experience) -> dict:
    """``out`` with the ``completions`` rows added when the module's rollout step is a multiple
    of ``every`` (``rollout.log_completions``; 0: never)."""
    if every and module.rollout_step % every == 0:
        step = module.trainer.global_step
        out[KEY] = completion_rows(experience, module.rollout_step, step)
    return out


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


class CompletionTable(Callback):
    """Writes the ``"completions"`` rows a training step returns (see the module docstring)."""

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        rows = outputs.get(KEY) if isinstance(outputs, dict) else None
        if not rows:
            return
        folder = _folder(trainer)
        name = "completions.jsonl" if trainer.global_rank == 0 else (
            f"completions.rank{trainer.global_rank}.jsonl"
        )  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / name).open("a", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row, ensure_ascii=False) + "\n")
        if trainer.global_rank != 0:
            return
        _to_loggers(trainer, rows)
        sample = rows[0]
        rank_zero_info(
            f"completion (rollout step {sample['rollout_step']}, reward {sample['reward']:.4g}): "
            f"{sample['prompt'][-_CONSOLE_CHARS:]!r} -> {sample['completion'][:_CONSOLE_CHARS]!r}"
        )


def _folder(trainer: Trainer) -> Path:
    logger = trainer.loggers[0] if trainer.loggers else None
    folder = getattr(logger, "log_dir", None) if logger is not None else None
    return Path(folder or trainer.default_root_dir)


def _to_loggers(trainer: Trainer, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            data = [[_cell(row.get(c)) for c in columns] for row in rows]
            logger.log_table(key=KEY, columns=columns, data=data)
        elif isinstance(logger, MLFlowLogger):
            table = {c: [_cell(row.get(c)) for row in rows] for c in columns}
            step = rows[0]["rollout_step"]
            logger.experiment.log_table(
                logger.run_id,
                data=table,
                artifact_file=f"{KEY}/step_{step:06d}.json",
            )


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value
