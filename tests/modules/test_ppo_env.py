"""PPOModule with an ``environment``: multi-turn training on builtin:tiny-llama through the CLI,
and the environment settings validated when the module is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rlhf.cli import cli_main
from lit_rlhf.envs import GuessNumberEnv
from lit_rlhf.modules import PPOModule
from tests.helpers import ConstantReward

CONFIGS = Path(__file__).parents[2] / "configs" / "ppo"


@pytest.mark.parametrize("penalty", ["0.0", "null"])
def test_ppo_module_with_env_trains_steps_on_tiny_llama(tmp_path, penalty):
    # budget_penalty null: the random model's turns are cut by max_new_tokens, so every episode
    # is left out of the loss; the step still runs (zero loss), nothing crashes
    cli = cli_main(
        [
            "fit",
            "--config",
            str(CONFIGS / "guess_number_tiny.yaml"),
            "--trainer.max_steps=2",
            "--trainer.limit_val_batches=0",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
            f"--model.init_args.budget_penalty={penalty}",
        ]
    )
    assert cli.trainer.state.finished and cli.model.rollout_step == 2
    metrics = cli.trainer.callback_metrics
    assert {"env/faults", "env/turns", "env/cut", "reward/env_reward"} <= metrics.keys()
    assert float(metrics["env/turns"]) >= 1


def test_ppo_module_env_settings_are_validated():
    reward = ConstantReward(0.0)
    PPOModule(reward, environment=GuessNumberEnv())  # the defaults build
    with pytest.raises(ValueError, match=r"dynamic_sampling.*Fix:"):
        PPOModule(reward, environment=GuessNumberEnv(), dynamic_sampling=True)
    with pytest.raises(ValueError, match=r"max_turns.*Fix:"):
        PPOModule(reward, environment=GuessNumberEnv(), max_turns=0)
    with pytest.raises(ValueError, match="step_timeout"):
        PPOModule(reward, environment=GuessNumberEnv(), env_step_timeout=0.0)
    with pytest.raises(TypeError, match="Fix:"):
        PPOModule(reward, environment=object())  # type: ignore[arg-type]
    assert PPOModule(reward).rollouts.multiturn is None  # default: the single-turn path
