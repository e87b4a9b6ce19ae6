"""PPOModule with an ``environment``: multi-turn training on builtin:tiny-llama through the CLI,
and the environment settings validated when the module is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_rlhf.cli import cli_main
from lit_rlhf.envs import GuessNumberEnv, StepResult
from lit_rlhf.modules import PPOModule
from lit_rlhf.types import GenerationOutput
from tests.helpers import ConstantReward, prompt_loader, quiet_trainer
from tests.modules.test_ppo import PROMPTS, make_module

CONFIGS = Path(__file__).parents[2] / "configs" / "ppo"


@pytest.mark.parametrize("penalty", ["0.0", "null"])
def test_ppo_module_with_env_trains_steps_on_tiny_llama(tmp_path, penalty):
    # budget_penalty null: the episodes a budget cut are left out of the loss, 0.0: they are
    # scored 0 and trained on; either way the steps run and nothing crashes
    cli = cli_main(
        [
            "fit",
            "--config",
            str(CONFIGS / "guess_number_tiny.yaml"),
            "--trainer.max_steps=2",
            "--trainer.limit_val_batches=0",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
            f"--model.init_args.env.budget_penalty={penalty}",
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
        PPOModule(reward, environment=GuessNumberEnv(), rollout={"dynamic_sampling": True})
    with pytest.raises(ValueError, match=r"max_turns.*Fix:"):
        PPOModule(reward, environment=GuessNumberEnv(), env={"max_turns": 0})
    with pytest.raises(ValueError, match="step_timeout"):
        PPOModule(reward, environment=GuessNumberEnv(), env={"step_timeout": 0.0})
    with pytest.raises(TypeError, match="Fix:"):
        PPOModule(reward, environment=object())  # type: ignore[arg-type]
    assert PPOModule(reward).rollouts.multiturn is None  # default: the single-turn path


class _EndsAtOnce:
    """Every episode ends after the agent's first turn: a single-turn task run through the
    multi-turn loop."""

    def reset(self, row):
        pass

    def step(self, turn):
        return StepResult("", done=True)


class _ScriptedTurns:
    """Row r of call c gets ``str((r + c) % 3) * (1 + r % 2) + " x"`` + EOS (the two samples of
    a prompt differ in digit share, so GRPO advantages are not zero); no log-probs of its own."""

    temperature, max_new_tokens = 1.0, 8

    def __init__(self):
        self.calls = 0

    def generate(self, model, input_ids, attention_mask, tokenizer, *, greedy=False,
                 log_probs=True, max_new_tokens=None):  # fmt: skip
        rows = []
        for r in range(len(input_ids)):
            text = f"{(r + self.calls) % 3}" * (1 + r % 2) + " x"
            rows.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [
                tokenizer.eos_token_id])  # fmt: skip
        self.calls += 1
        width = max(map(len, rows))
        pad = tokenizer.pad_token_id
        ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
        mask = torch.tensor([[True] * len(row) + [False] * (width - len(row)) for row in rows])
        return GenerationOutput(ids, mask, None)

    def sync_weights(self, model):
        pass


def test_one_turn_episodes_train_like_the_single_turn_path(tiny_model_dir, tmp_path):
    """The multi-turn loop with an environment that ends every episode after one turn trains
    the same weights as the single-turn path on the same sampled tokens (GRPO, 2 steps)."""
    weights, initial = [], None
    for env in (None, _EndsAtOnce()):
        torch.manual_seed(0)
        module = make_module(
            tiny_model_dir,
            engine=_ScriptedTurns(),
            environment=env,
            advantage={"estimator": "grpo"},
            rollout={"samples_per_prompt": 2},
            mismatch={"correction": "none"},
        )
        module.configure_model()
        initial = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        trainer = quiet_trainer(tmp_path / str(env is None), limit_train_batches=2)
        trainer.fit(module, prompt_loader(module.tokenizer, PROMPTS, 2))
        weights.append({n: p.detach().clone() for n, p in module.policy.named_parameters()})
    assert any(not torch.equal(initial[n], w) for n, w in weights[0].items())  # it trained
    for name, single_turn in weights[0].items():
        torch.testing.assert_close(weights[1][name], single_turn, rtol=1e-5, atol=1e-6)
