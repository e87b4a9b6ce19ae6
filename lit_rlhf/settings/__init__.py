"""Settings groups: one frozen, validated dataclass per concern, shared by every module that has
the concern, taken as typed constructor arguments (``model.init_args.<group>.<field>`` in YAML).

| group | class | modules |
|---|---|---|
| ``optim`` | :class:`OptimSettings` | all (AdamW, clipping, micro-batches, lr schedule) |
| ``precision`` | :class:`PrecisionSettings` | all (dtypes, activation checkpointing) |
| ``lora`` | :class:`LoRASettings` | PPO, GRM, DPO, compressor |
| ``update`` | :class:`UpdateSettings` | PPO, GRM (epochs, mini-batches, token budgets) |
| ``rollout`` | :class:`RolloutSettings` | PPO, GRM (G, staleness, DAPO's sampling and length) |
| ``advantage`` | :class:`AdvantageSettings` | PPO, GRM (estimator and its constants) |
| ``loss`` | :class:`PolicyLossSettings` | PPO, GRM (ratio clipping, aggregation) |
| ``mismatch`` | :class:`MismatchSettings` | PPO, GRM (engine vs trainer log-probs) |
| ``kl`` | :class:`KLSettings` | PPO, GRM (the KL to a frozen reference) |
| ``critic`` | :class:`CriticSettings` | PPO (GAE's learned critic) |
| ``distill`` | :class:`DistillSettings` | PPO (on-policy distillation from a frozen teacher) |
| ``env`` | :class:`EnvironmentSettings` | PPO (multi-turn episode limits) |
| ``eval`` | :class:`EvalSettings` | PPO (pass@1, pass@k) |
| ``judge`` | :class:`JudgeSettings` | GRM (the judge's evaluation and prompt format) |
| ``loss`` | :class:`PreferenceLossSettings` | DPO (sigmoid / IPO / SimPO and their constants) |
| ``data`` | :class:`DataBatchSettings` | the data modules' ``batch_size`` / ``global_batch_size`` |

A group validates itself when it is built (before any model loads), with messages that name the
dotted key; modules read their groups with :func:`take_groups` after ``save_hyperparameters``,
which stores each in ``hparams`` as a plain dict (:func:`store_groups`), so
checkpoints load with ``weights_only=True`` and through the CLI. Flat argument names from before
the groups are refused from Python with the dotted name (:func:`refuse_flat_arguments`) and
regrouped when an old checkpoint is read (:func:`regroup_flat`).

This package sits just above ``algos`` (it imports nothing else of lit-rlhf), so every floor can
read the groups.
"""

from lit_rlhf.settings.base import SettingsGroup, closest_field, unknown_key_message
from lit_rlhf.settings.batch import DataBatchSettings, split_over_processes
from lit_rlhf.settings.distill import DistillSettings
from lit_rlhf.settings.env import EnvironmentSettings, EvalSettings
from lit_rlhf.settings.flat import (
    flat_map,
    group_params,
    is_flat,
    refuse_flat_arguments,
    regroup_flat,
    store_groups,
    take_groups,
)
from lit_rlhf.settings.judge import JudgeSettings
from lit_rlhf.settings.lora import LoRASettings, Quantize
from lit_rlhf.settings.optim import LRInterval, OptimSettings
from lit_rlhf.settings.policy import (
    AdvantageSettings,
    CriticSettings,
    KLSettings,
    MismatchSettings,
    PolicyLossSettings,
    RolloutSettings,
    UpdateSettings,
)
from lit_rlhf.settings.precision import Dtype, PrecisionSettings
from lit_rlhf.settings.preference import PreferenceLoss, PreferenceLossSettings

__all__ = [
    "AdvantageSettings",
    "CriticSettings",
    "DataBatchSettings",
    "DistillSettings",
    "Dtype",
    "EnvironmentSettings",
    "EvalSettings",
    "JudgeSettings",
    "KLSettings",
    "LRInterval",
    "LoRASettings",
    "MismatchSettings",
    "OptimSettings",
    "PolicyLossSettings",
    "PrecisionSettings",
    "PreferenceLoss",
    "PreferenceLossSettings",
    "Quantize",
    "RolloutSettings",
    "SettingsGroup",
    "UpdateSettings",
    "closest_field",
    "flat_map",
    "group_params",
    "is_flat",
    "refuse_flat_arguments",
    "regroup_flat",
    "split_over_processes",
    "store_groups",
    "take_groups",
    "unknown_key_message",
]
