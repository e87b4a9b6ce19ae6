"""``builtin:tiny-llama-agent``'s warm start: its demonstrations are what
:mod:`lit_rlhf.envs.tiny_demos` writes on the tiny configs' prompts, and
they are laid out token for token as the multi-turn loop lays out an episode (the CLI runs that
show its episodes taking several turns are in tests/envs/test_user_envs_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from lit_rlhf.data.prompts import render_chat_prompt
from lit_rlhf.envs import CountdownCalculatorEnv, tiny_demos
from lit_rlhf.models import load_tokenizer
from lit_rlhf.models.warm_start import DEMOS, episode_tokens, read_demos
from lit_rlhf.settings import EnvironmentSettings
from lit_rlhf.training.multiturn import MultiTurnRollout, observation_role

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "ppo"


def test_shipped_demonstrations_are_what_the_module_writes_on_the_configs_prompts():
    shipped = [json.loads(line) for line in DEMOS.read_text().splitlines()]
    assert shipped == tiny_demos.rows()
    turns = [sum(m["role"] == "assistant" for m in row["messages"]) for row in shipped]
    assert sum(t > 1 for t in turns) > len(shipped) / 2  # mostly multi-turn episodes
    for name, args in (("countdown_calculator_tiny", tiny_demos.COUNTDOWN),
                       ("guess_number_tiny", tiny_demos.GUESS)):  # fmt: skip
        data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["data"]["init_args"]
        assert data.get("system_prompt") == (
            tiny_demos.SYSTEM_PROMPT if "countdown" in name else None
        )
        train = data["train"]["init_args"]
        assert {k: train[k] for k in args} == args
        assert train["seed"] != 2 and data["val"]["init_args"]["seed"] != 2
    assert observation_role(load_tokenizer("builtin:tiny-llama")) == tiny_demos.ROLE


def test_a_demonstration_is_laid_out_as_the_loop_lays_out_an_episode():
    tokenizer = load_tokenizer("builtin:tiny-llama")
    demo = next(row for row in read_demos() if len(row["messages"]) == 5)
    system, user, turn1, tool, turn2 = (m["content"] for m in demo["messages"])

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    eos = tokenizer.eos_token_id
    loop = MultiTurnRollout(CountdownCalculatorEnv(), EnvironmentSettings(max_turns=2))
    prompt = ids(render_chat_prompt(tokenizer, user, system_prompt=system))
    agent1, env, agent2 = [*ids(turn1), eos], ids(loop.render(tokenizer, tool)), [*ids(turn2), eos]
    tokens, agent = episode_tokens(tokenizer, demo["messages"])
    assert tokens == prompt + agent1 + env + agent2
    assert agent == [False] * len(prompt) + [True] * len(agent1) + [False] * len(env) + [
        True
    ] * len(agent2)
