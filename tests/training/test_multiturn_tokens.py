"""Token-in / token-out multi-turn rollouts with a scripted engine and environment: the trained
tokens are the sampled ones, environment tokens carry no loss, turn boundaries, log-probs and
rewards line up, and environment faults become observations."""

from __future__ import annotations

import copy
import time

import pytest
import torch

from lit_rlhf.envs import CountdownCalculatorEnv, StepResult
from lit_rlhf.models import load_causal_lm, load_tokenizer
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.settings import AdvantageSettings, EnvironmentSettings
from lit_rlhf.training import PPOSettings
from lit_rlhf.training.experience import build_experience, compute_advantages
from lit_rlhf.training.multiturn import MultiTurnRollout
from lit_rlhf.training.ppo_update import PPOUpdate
from lit_rlhf.training.rollouts import RolloutCollector
from lit_rlhf.types import GenerationOutput
from tests.helpers import ConstantReward

# a template that trims whitespace: re-rendering the agent's text would change its tokens
TRIMMING = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}<|endoftext|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    tok = copy.deepcopy(load_tokenizer("builtin:tiny-llama"))
    tok.chat_template = TRIMMING
    return tok


class ScriptedEngine:
    """Returns the next scripted turn (token ids, EOS included) for each row and records the
    token sequences it was given."""

    temperature = 1.0
    max_new_tokens = 64

    def __init__(self, turns: list[list[list[int]]]) -> None:
        self.turns = turns  # [call][row] -> token ids
        self.inputs: list[list[list[int]]] = []

    def generate(
        self, model, input_ids, attention_mask, tokenizer, *, greedy=False, log_probs=True
    ):
        call = len(self.inputs)
        pairs = zip(input_ids, attention_mask.bool(), strict=True)
        self.inputs.append([ids[m].tolist() for ids, m in pairs])
        rows = self.turns[call][: len(input_ids)]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])
        logps = torch.tensor([[-0.01 * (call * 100 + j + 1) for j in range(width)]] * len(rows))
        return GenerationOutput(ids, mask, logps.masked_fill(~mask, 0.0) if log_probs else None)

    def sync_weights(self, model):
        pass


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _batch(tokenizer, n: int = 1):
    prompt = _encode(tokenizer, "<|user|>Reach 27 with 3 4 5<|endoftext|><|assistant|>")
    rows = [{"numbers": [3, 4, 5], "target": 27, "query_id": str(i)} for i in range(n)]
    return {
        "input_ids": torch.tensor([prompt] * n),
        "attention_mask": torch.ones(n, len(prompt), dtype=torch.long),
        "prompt": ["p"] * n,
        "row": rows,
        "query_id": [str(i) for i in range(n)],
        "task": ["countdown"] * n,
    }


def _calculator_episode(tokenizer, settings=None):
    eos = tokenizer.eos_token_id
    turn1 = [*_encode(tokenizer, "  <tool>calculator:  3*(4+5) </tool>  "), eos]
    turn2 = [*_encode(tokenizer, " <answer>3*(4+5)</answer> "), eos]
    engine = ScriptedEngine([[turn1], [turn2]])
    loop = MultiTurnRollout(CountdownCalculatorEnv(), settings or EnvironmentSettings(max_turns=3))
    collector = RolloutCollector(engine, ConstantReward(1.0), multiturn=loop)
    policy = load_causal_lm("builtin:tiny-llama")
    rollout = collector.collect(policy, tokenizer, _batch(tokenizer), samples_per_prompt=1)
    return rollout, engine, loop, turn1, turn2, policy


def test_trained_tokens_are_the_sampled_tokens_and_env_turns_are_rendered_once(tokenizer):
    rollout, engine, loop, turn1, turn2, _ = _calculator_episode(tokenizer)
    env_ids = _encode(tokenizer, loop.render(tokenizer, "<result>27</result>"))
    assert loop.render(tokenizer, "<result>27</result>") == "<|tool|><result>27</result>" + (
        "<|endoftext|><|assistant|>"
    )
    n1, ne, n2 = len(turn1), len(env_ids), len(turn2)
    response = rollout.response_ids[0].tolist()
    agent = rollout.agent_mask[0].tolist()
    assert response[: n1 + ne + n2] == turn1 + env_ids + turn2  # exactly the sampled tokens
    assert agent[: n1 + ne + n2] == [True] * n1 + [False] * ne + [True] * n2
    assert int(rollout.response_mask[0].sum()) == n1 + ne + n2
    # token-in: the second engine call got the prompt, turn 1 and the environment's tokens
    prompt = rollout.prompt_ids[0].tolist()
    assert engine.inputs[1][0] == prompt + turn1 + env_ids
    # turn boundaries: the last agent token of each turn; turn 3 was not taken
    assert rollout.turn_ends[0].tolist() == [n1 - 1, n1 + ne + n2 - 1, -1]
    # the engine's log-probs on agent tokens, 0 on environment tokens
    logps = rollout.sample_log_probs[0]
    assert torch.allclose(logps[:n1], torch.tensor([-0.01 * (j + 1) for j in range(n1)]))
    assert torch.allclose(logps[n1 + ne : n1 + ne + n2], torch.tensor(
        [-0.01 * (100 + j + 1) for j in range(n2)]))  # fmt: skip
    assert torch.all(logps[n1 : n1 + ne] == 0)
    # re-rendering the conversation through the (trimming) template gives other tokens
    messages = [
        {"role": "assistant", "content": tokenizer.decode(turn1, skip_special_tokens=True)},
        {"role": "tool", "content": "<result>27</result>"},
        {"role": "assistant", "content": tokenizer.decode(turn2, skip_special_tokens=True)},
    ]
    rerendered = _encode(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False))
    assert rerendered != response[: n1 + ne + n2]
    assert float(rollout.scores[0]) == 1.0  # the final reward, no turn rewards
    assert not bool(rollout.cut[0]) and float(rollout.term_stats["env/faults"]) == 0
    assert float(rollout.term_stats["env/tool_calls"]) == 1.0  # turn 1 called the calculator


def _loss_and_grads(policy, experience):
    policy.zero_grad()
    update = PPOUpdate(policy, PPOSettings(), experience, temperature=1.0, kl_coef=0.0)
    (micro,) = update.micro_batches(torch.arange(len(experience)))
    loss = update.loss(micro)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in policy.parameters()], micro


def test_env_tokens_carry_no_loss_gradient(tokenizer):
    rollout, *_, policy = _calculator_episode(tokenizer)
    torch.manual_seed(0)
    experience = build_experience(
        rollout, policy=policy, settings=PPOSettings(), temperature=1.0, kl_coef=0.0
    )
    experience.advantages = torch.randn_like(experience.advantages)  # one sample: GRPO gives 0
    loss, grads, micro = _loss_and_grads(policy, experience)
    env = rollout.response_mask & ~rollout.agent_mask
    assert int(micro.num_tokens) == int(rollout.agent_mask.sum())  # token-mean denominator
    changed = copy.copy(experience)
    changed.old_log_probs = experience.old_log_probs.masked_fill(env, -5.0)
    changed.advantages = experience.advantages.masked_fill(env, 100.0)
    loss2, grads2, _ = _loss_and_grads(policy, changed)
    assert torch.equal(loss, loss2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))
    agent_changed = copy.copy(experience)  # control: the agent's tokens do count
    agent_changed.advantages = experience.advantages.masked_fill(rollout.agent_mask, 100.0)
    assert not torch.equal(_loss_and_grads(policy, agent_changed)[0], loss)


def test_env_turn_rewards_sit_on_each_turns_last_agent_token_with_gae(tokenizer):
    rollout, *_ = _calculator_episode(tokenizer)
    rollout.turn_rewards = torch.tensor([[0.5, 0.25, 0.0]])
    rollout.scores = torch.tensor([1.75])  # final 1.0 + turn rewards 0.75
    values = torch.zeros(rollout.response_ids.shape)
    settings = PPOSettings(advantage=AdvantageSettings(estimator="gae", whiten=False))
    adv, returns = compute_advantages(
        rollout, settings, old_log_probs=None, ref_log_probs=None, values=values, kl_coef=0.0
    )
    first, second = rollout.turn_ends[0, :2].tolist()
    env = rollout.response_mask & ~rollout.agent_mask
    assert torch.all(adv[env] == 0) and torch.all(returns[env] == 0)
    # gamma = lam = 1, values 0: the return of a token is the reward still to come
    assert float(returns[0, first]) == pytest.approx(0.5 + 0.25 + 1.0)
    assert float(returns[0, first + 1]) == 0.0  # an environment token
    assert float(returns[0, second]) == pytest.approx(0.25 + 1.0)


class FaultyEnv:
    """Raises, hangs, or hands over to the calculator, by the turn's text."""

    def __init__(self) -> None:
        self.calculator = CountdownCalculatorEnv()

    def reset(self, row):
        self.calculator.reset(row)

    def step(self, turn: str) -> StepResult:
        if "raise" in turn:
            raise RuntimeError("boom")
        if "hang" in turn:
            time.sleep(3)
        return self.calculator.step(turn)


def test_bad_tool_call_env_exception_and_timeout_are_observations_and_faults(tokenizer):
    eos = tokenizer.eos_token_id
    turns = ["<tool>calculator 3</tool>", "raise", "hang", "<answer>1</answer>"]
    engine = ScriptedEngine([[[*_encode(tokenizer, t), eos]] for t in turns])
    settings = EnvironmentSettings(max_turns=4, step_timeout=0.2)
    loop = MultiTurnRollout(FaultyEnv(), settings)
    collector = RolloutCollector(engine, ConstantReward(0.0), multiturn=loop)
    policy = load_causal_lm("builtin:tiny-llama")
    rollout = collector.collect(policy, tokenizer, _batch(tokenizer), samples_per_prompt=1)
    assert float(rollout.term_stats["env/faults"]) == 3
    assert float(rollout.term_stats["env/turns"]) == 4  # the episode went on to its answer
    assert float(rollout.term_stats["env/tool_calls"]) == 0.0  # its only call was malformed
    text = tokenizer.decode(rollout.response_ids[0][rollout.response_mask[0]])
    assert "<error>malformed tool call" in text
    assert "<error>the environment failed (RuntimeError)</error>" in text
    assert "<error>the environment timed out after 0.2s</error>" in text


class BrokenReset:
    def reset(self, row):
        raise KeyError("the row has no 'target'")

    def step(self, turn: str) -> StepResult:
        raise AssertionError("an environment whose reset failed is never stepped")


def test_a_reset_that_raises_is_a_fault_and_ends_the_episode_after_one_turn(tokenizer):
    eos = tokenizer.eos_token_id
    engine = ScriptedEngine([[[*_encode(tokenizer, "<tool>calculator: 1+1</tool>"), eos]]])
    loop = MultiTurnRollout(BrokenReset(), EnvironmentSettings(max_turns=3))
    collector = RolloutCollector(engine, ConstantReward(0.0), multiturn=loop)
    policy = load_causal_lm("builtin:tiny-llama")
    rollout = collector.collect(policy, tokenizer, _batch(tokenizer), samples_per_prompt=1)
    assert float(rollout.term_stats["env/faults"]) == 1
    assert float(rollout.term_stats["env/turns"]) == 1  # the run went on; the episode ended


def test_tool_call_rate_is_the_share_of_episodes_with_a_well_formed_call(tokenizer):
    eos = tokenizer.eos_token_id
    call, answer = ("<tool>calculator: 3+4</tool>", "<answer>3+4</answer>")
    call, answer = ([*_encode(tokenizer, t), eos] for t in (call, answer))
    # 4 episodes; turn 1: a call, an answer, a second call, an answer; turn 2 (the two still
    # active): answers. Two of the four episodes called: 2 / 4 = 0.5, though three of the six
    # turns taken were not calls.
    engine = ScriptedEngine([[call, answer, call, answer], [answer, answer]])
    loop = MultiTurnRollout(CountdownCalculatorEnv(), EnvironmentSettings(max_turns=2))
    collector = RolloutCollector(engine, ConstantReward(0.0), multiturn=loop)
    policy = load_causal_lm("builtin:tiny-llama")
    rollout = collector.collect(policy, tokenizer, _batch(tokenizer, 4), samples_per_prompt=1)
    assert float(rollout.term_stats["env/tool_calls"]) == 0.5
    assert float(rollout.term_stats["env/turns"]) == 1.5  # (2 + 1 + 2 + 1) / 4


def test_token_budget_cut_is_masked_or_penalised(tokenizer):
    settings = EnvironmentSettings(max_turns=3, max_turn_tokens=4)
    rollout, *_ = _calculator_episode(tokenizer, settings)
    assert bool(rollout.cut[0]) and int(rollout.agent_mask.sum()) == 4  # turn 1 cut at 4
    assert rollout.turn_ends[0].tolist() == [3, -1, -1]
    penalised = EnvironmentSettings(max_turns=3, max_episode_tokens=6, budget_penalty=-1.0)
    rollout, *_ = _calculator_episode(tokenizer, penalised)
    assert bool(rollout.cut[0]) and float(rollout.scores[0]) == -1.0
    with pytest.raises(ValueError, match="Fix:"):
        EnvironmentSettings(max_turns=0)


class BudgetSpy(HFGenerationEngine):
    """The HF engine, recording each call's per-call budget and generated width."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = []

    def generate(self, *args, max_new_tokens=None, **kwargs):
        out = super().generate(*args, max_new_tokens=max_new_tokens, **kwargs)
        self.calls.append((max_new_tokens, out.response_ids.shape[1]))
        return out


def test_engines_get_the_turn_budget_per_call(tokenizer):
    engine = BudgetSpy(max_new_tokens=32)
    settings = EnvironmentSettings(max_turns=2, max_turn_tokens=5, max_episode_tokens=40)
    loop = MultiTurnRollout(CountdownCalculatorEnv(), settings)
    collector = RolloutCollector(engine, ConstantReward(0.0), multiturn=loop)
    policy = load_causal_lm("builtin:tiny-llama")
    torch.manual_seed(0)
    collector.collect(policy, tokenizer, _batch(tokenizer, 2), samples_per_prompt=2)
    assert engine.calls and all(budget == 5 and width <= 5 for budget, width in engine.calls)
