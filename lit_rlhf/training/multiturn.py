"""Token-in / token-out multi-turn rollouts: one loop, shared by every generation engine.

Each episode is a prompt's token ids followed by alternating agent turns (sampled by the engine
through its ordinary token-in ``generate``) and environment turns (the environment's
observation rendered once with the chat template's ``tool`` role and tokenised once). The
agent's sampled tokens are kept as sampled, never decoded and re-rendered, so the tokens the
update trains on are exactly the ones the engine sampled, with the engine's log-probs.

Budgets and the cut rule: each engine call is capped at the largest remaining turn budget of
its episodes (the engines' per-call ``max_new_tokens``); an agent turn that ends without an
end-of-sequence token (it hit the engine's ``max_new_tokens``, ``env.max_turn_tokens`` or the
episode's remaining ``env.max_episode_tokens``), or an environment turn that does not fit in
``env.max_episode_tokens``, cuts the episode there (``Rollout.cut``). A cut episode is left out
of the loss (its score still enters the group baseline) or, with ``env.budget_penalty`` set,
scored that value and trained on.
An episode also ends when the environment says ``done`` or after ``env.max_turns`` agent turns.

Faults: environment code never ends the run. A step that raises (any exception, ``SystemExit``
and ``KeyboardInterrupt`` included: environment code runs in a worker thread, and Python runs
the handlers of the run's own interruption, Ctrl-C or SIGTERM, only in the main thread) or runs
past ``env.step_timeout`` seconds is answered with an ``<error>`` observation and the episode
goes on; a step that returns no :class:`StepResult` (None, a wrongly shaped or typed value) or a
non-finite reward ends the episode, its turn scored 0. After a step that timed out the episode's
environment is not called again (the call may still be running): its next turn ends the
episode; after a ``reset`` that raised or timed out, the episode's first agent turn is taken
and ends it. Each is counted in ``env/faults`` (the total) and ``env/faults/<kind>``
(:data:`FAULT_KINDS`), with the bad tool calls the environment reports itself
(``StepResult.fault``) as ``reported``.
``env/tool_calls`` is the share of episodes with at least one turn the environment flagged as a
well-formed tool call (``StepResult.tool_call``).
"""

from __future__ import annotations

import copy
import inspect
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.envs.base import StepResult, check_environment
from lit_rlhf.envs.tools import error_text
from lit_rlhf.rollout.base import GenerationEngine
from lit_rlhf.settings import EnvironmentSettings
from lit_rlhf.types import GenerationOutput

_UNLIMITED = 1 << 30  # no per-turn budget
# env/faults/<kind>: a step that raised an Exception / another BaseException (SystemExit,
# KeyboardInterrupt raised by environment code) / timed out / returned no StepResult / gave a
# non-finite reward; a reset that raised or timed out; a bad call the environment reported
FAULT_KINDS = (
    "exception", "base_exception", "timeout", "bad_return", "nonfinite_reward", "reset",
    "reported",
)  # fmt: skip


@dataclass
class _Episode:
    prompt: list[int]
    env: Any
    ids: list[int] = field(default_factory=list)
    agent: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # -1: not tagged, environment tokens
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    done: bool = False
    cut: bool = False
    faults: Counter[str] = field(default_factory=Counter)  # by kind (FAULT_KINDS)
    tool_calls: int = 0  # turns the environment flagged as a well-formed tool call


@dataclass
class MultiTurnOutput:
    """The loop's result: the usual generation output over the whole transcript plus the
    multi-turn fields of :class:`~lit_rlhf.types.Rollout` and ``env/*`` statistics."""

    generation: GenerationOutput  # response_ids / response_mask / log_probs over all turns
    agent_mask: Tensor  # [B, R] bool
    turn_ends: Tensor  # [B, K] long, -1 = no such turn
    turn_rewards: Tensor  # [B, K] float32
    cut: Tensor  # [B] bool
    stats: dict[str, Tensor]


class MultiTurnRollout:
    """Runs episodes of ``environment`` (a prototype copied per episode) with any engine."""

    def __init__(self, environment: Any, env: EnvironmentSettings) -> None:
        check_environment(environment)
        self.environment = environment
        self.settings = env  # validated when built
        self.timeout, self.max_turns = env.step_timeout, env.max_turns
        self.turn_tokens = env.max_turn_tokens
        self.episode_tokens = env.max_episode_tokens
        self.budget_penalty = env.budget_penalty
        self._roles: dict[int, str] = {}  # id(tokenizer) -> the role environment turns use

    def generate(
        self,
        engine: GenerationEngine,
        policy: nn.Module,
        tokenizer: Any,
        prompt_ids: Tensor,  # [B, P] left-padded
        prompt_mask: Tensor,  # [B, P]
        rows: Sequence[Mapping[str, Any]],
        *,
        greedy: bool = False,
        log_probs: bool = True,
    ) -> MultiTurnOutput:
        """Play one episode per prompt row, every active episode's turn in one engine call."""
        episodes = []
        for ids, mask, row in zip(prompt_ids, prompt_mask.bool(), rows, strict=True):
            ep = _Episode(ids[mask].tolist(), copy.deepcopy(self.environment))
            _, failure = _guarded(ep.env.reset, row, timeout=self.timeout)
            if failure is not None:  # the episode's first turn is taken and ends it
                ep.faults["reset"] += 1
                ep.env = _Unavailable(f"its reset {failure[1]}")
            episodes.append(ep)
        for _ in range(self.max_turns):
            active = [ep for ep in episodes if not ep.done]
            if not active:
                break
            self._agent_turns(engine, policy, tokenizer, active, greedy, log_probs)
            for ep in active:
                if not ep.done:
                    self._environment_turn(ep, tokenizer)
        return self._output(episodes, tokenizer, prompt_ids.device, log_probs)

    def _agent_turns(
        self, engine: Any, policy: nn.Module, tokenizer: Any, active: list[_Episode],
        greedy: bool, log_probs: bool,
    ) -> None:  # fmt: skip
        """One engine call over the active episodes' full token sequences (left-padded)."""
        pad = tokenizer.pad_token_id
        seqs = [ep.prompt + ep.ids for ep in active]
        width = max(len(s) for s in seqs)
        device = _device(policy)
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)
        mask = torch.tensor(
            [[False] * (width - len(s)) + [True] * len(s) for s in seqs], device=device
        )
        budget = max(self._turn_budget(ep) for ep in active)  # cut per episode below
        extra = {"max_new_tokens": budget} if budget < _UNLIMITED and _takes_budget(engine) else {}
        out = engine.generate(
            policy, ids, mask, tokenizer, greedy=greedy, log_probs=log_probs, **extra
        )
        eos = _eos_ids(tokenizer)
        for i, ep in enumerate(active):
            n = int(out.response_mask[i].sum())
            tokens = out.response_ids[i, :n].tolist()
            logps = out.log_probs[i, :n].tolist() if out.log_probs is not None else [0.0] * n
            tags = [-1] * n if out.token_versions is None else out.token_versions[i, :n].tolist()
            keep = min(n, self._turn_budget(ep))
            tokens, logps = tokens[:keep], logps[:keep]
            ep.ids += tokens
            ep.agent += [True] * keep
            ep.log_probs += logps
            ep.versions += tags[:keep]
            ep.turn_ends.append(len(ep.ids) - 1)
            ep.turn_rewards.append(0.0)
            if not tokens or tokens[-1] not in eos:  # the turn did not end: a budget cut it
                ep.cut = ep.done = True

    def _turn_budget(self, ep: _Episode) -> int:
        turn, episode = self.turn_tokens, self.episode_tokens
        budget = turn if turn is not None else _UNLIMITED
        if episode is not None:
            budget = min(budget, episode - len(ep.ids))
        return max(budget, 0)

    def _environment_turn(self, ep: _Episode, tokenizer: Any) -> None:
        """Step the environment on the turn's text; its reward goes on the turn, its
        observation (if the episode goes on) is appended as environment tokens."""
        start = ep.turn_ends[-2] + 1 if len(ep.turn_ends) > 1 else 0
        turn = [t for t, a in zip(ep.ids[start:], ep.agent[start:], strict=True) if a]
        result, kind = guarded_step(ep.env, tokenizer.decode(turn, skip_special_tokens=True),
                                    timeout=self.timeout)  # fmt: skip
        ep.turn_rewards[-1] = result.reward
        if kind is not None:
            ep.faults[kind] += 1
        if kind == "timeout":  # never step it again: the step may still be running
            ep.env = _Unavailable("a step timed out")
        ep.tool_calls += bool(result.tool_call)
        if result.done or len(ep.turn_ends) >= self.max_turns:
            ep.done = True
            return
        obs = tokenizer(self.render(tokenizer, result.observation), add_special_tokens=False)
        obs_ids = list(obs["input_ids"])
        limit = self.episode_tokens
        if limit is not None and len(ep.ids) + len(obs_ids) >= limit:  # no room for a turn
            ep.cut = ep.done = True
            return
        ep.ids += obs_ids
        ep.agent += [False] * len(obs_ids)
        ep.log_probs += [0.0] * len(obs_ids)
        ep.versions += [-1] * len(obs_ids)

    def render(self, tokenizer: Any, observation: str) -> str:
        """The environment turn's text after the agent's end-of-sequence token: the chat
        template's rendering of a ``tool`` message (``user`` where the template refuses
        ``tool``) followed by the generation prompt; plain ``\\ntool: ...\\n`` without a
        template."""
        if not getattr(tokenizer, "chat_template", None):
            return f"\ntool: {observation}\n"
        role = self._role(tokenizer)
        base = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
        full = tokenizer.apply_chat_template(
            [*base, {"role": role, "content": observation}],
            tokenize=False,
            add_generation_prompt=True,
        )
        return full[self._head_length(tokenizer, base) :]

    def _role(self, tokenizer: Any) -> str:
        key = id(tokenizer)
        if key not in self._roles:
            self._roles[key] = observation_role(tokenizer)
        return self._roles[key]

    @staticmethod
    def _head_length(tokenizer: Any, base: list[dict[str, str]]) -> int:
        """Characters of the rendered ``base`` up to and including the assistant's content and
        end-of-sequence token (the agent's own tokens already hold that much)."""
        head = tokenizer.apply_chat_template(base, tokenize=False)
        end = head.rindex("A") + 1
        eos = tokenizer.eos_token or ""
        return end + len(eos) if eos and head.startswith(eos, end) else end

    def _output(
        self, episodes: list[_Episode], tokenizer: Any, device: Any, log_probs: bool
    ) -> MultiTurnOutput:
        pad, k = tokenizer.pad_token_id, self.max_turns
        width = max(1, *(len(ep.ids) for ep in episodes))

        def padded(values: list[Any], fill: Any) -> list[Any]:
            return values + [fill] * (width - len(values))

        ids = torch.tensor([padded(ep.ids, pad) for ep in episodes], device=device)
        lengths = torch.tensor([len(ep.ids) for ep in episodes], device=device)
        mask = torch.arange(width, device=device)[None, :] < lengths[:, None]
        agent = torch.tensor([padded(ep.agent, False) for ep in episodes], device=device)
        logps = torch.tensor([padded(ep.log_probs, 0.0) for ep in episodes], device=device)
        tags = torch.tensor([padded(ep.versions, -1) for ep in episodes], device=device)
        ends = [ep.turn_ends + [-1] * (k - len(ep.turn_ends)) for ep in episodes]
        rewards = [ep.turn_rewards + [0.0] * (k - len(ep.turn_rewards)) for ep in episodes]
        cut = torch.tensor([ep.cut for ep in episodes], device=device)
        faults = sum((ep.faults for ep in episodes), Counter[str]())
        stats = {
            "env/faults": torch.tensor(float(faults.total())),
            **{f"env/faults/{k}": torch.tensor(float(faults[k])) for k in FAULT_KINDS},
            "env/turns": torch.tensor([float(len(ep.turn_ends)) for ep in episodes]).mean(),
            "env/cut": cut.float().mean().cpu(),
            # share of episodes with at least one well-formed tool call (StepResult.tool_call)
            "env/tool_calls": torch.tensor([float(ep.tool_calls > 0) for ep in episodes]).mean(),
        }
        return MultiTurnOutput(
            generation=GenerationOutput(  # token versions: the agent's tokens, if tagged
                ids, mask, logps.float() if log_probs else None, tags if (tags >= 0).any() else None
            ),
            agent_mask=agent & mask,
            turn_ends=torch.tensor(ends, device=device),
            turn_rewards=torch.tensor(rewards, device=device, dtype=torch.float32),
            cut=cut,
            stats=stats,
        )


def guarded_step(env: Any, turn: str, *, timeout: float) -> tuple[StepResult, str | None]:
    """``env.step(turn)`` run in a daemon thread for at most ``timeout`` seconds, and the fault
    kind of the turn (:data:`FAULT_KINDS`; None: no fault). Anything raised and a timeout
    become an ``<error>`` observation (a step that never returns keeps its thread, and the loop
    never steps that environment again: :class:`_Unavailable` answers its episode's next step);
    a return that is no :class:`StepResult` and a non-finite reward end the episode."""
    result, failure = _guarded(env.step, turn, timeout=timeout)
    if failure is not None:
        kind, why = failure
        return StepResult(error_text(f"the environment {why}"), fault=kind), kind
    checked = as_step_result(result)
    if checked is None:
        why = f"returned {type(result).__name__}, not a StepResult"
        return _ended(why, "bad_return"), "bad_return"
    if not math.isfinite(checked.reward):
        kind = "nonfinite_reward"
        return _ended(f"gave a non-finite reward ({checked.reward})", kind), kind
    return checked, ("reported" if checked.fault is not None else None)


def as_step_result(value: Any) -> StepResult | None:
    """``value`` as a :class:`StepResult` with a ``str`` observation, a float reward and a
    ``str`` or None fault (a plain tuple or list of its fields is taken too); None when it is
    not one."""
    if not isinstance(value, tuple | list) or not 1 <= len(value) <= len(StepResult._fields):
        return None
    result = value if isinstance(value, StepResult) else StepResult(*value)
    reward = result.reward
    if not isinstance(result.observation, str) or isinstance(reward, str | bytes):
        return None
    if not (result.fault is None or isinstance(result.fault, str)):
        return None
    try:
        reward = float(reward)  # a bool, a NumPy number or a one-element tensor too
    except (TypeError, ValueError):  # e.g. a string, a tensor of several values
        return None
    return result._replace(reward=reward, done=bool(result.done), tool_call=bool(result.tool_call))


def _ended(why: str, kind: str) -> StepResult:
    return StepResult(error_text(f"the environment {why}"), done=True, fault=kind)


def _guarded(fn: Any, arg: Any, *, timeout: float) -> tuple[Any, tuple[str, str] | None]:
    """(``fn(arg)``, None), or (None, (fault kind, why it failed)) when it raised or ran past
    ``timeout`` seconds (it then keeps running in its daemon thread). Everything ``fn`` raises
    is caught, ``SystemExit`` and ``KeyboardInterrupt`` included: ``fn`` runs in its own
    thread, and Python runs signal handlers (Ctrl-C, SIGTERM) only in the main thread, which
    waits here in 0.1 s joins (a signal is handled within 0.1 s, not when ``fn`` returns) and
    is never guarded, so what the thread raises is the environment's own doing."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(arg)
        except BaseException as err:  # environment code is untrusted: never end the run
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
        thread.join(min(left, 0.1))  # back in the main thread's loop: a signal is handled now
    if thread.is_alive():
        return None, ("timeout", f"timed out after {timeout}s")
    if "error" in box:
        err = box["error"]
        kind = "exception" if isinstance(err, Exception) else "base_exception"
        return None, (kind, f"failed ({type(err).__name__})")
    return box.get("result"), None


class _Unavailable:
    """Stands in for an episode's environment after its reset failed or a step timed out (the
    fault was counted then): the next step ends the episode."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def step(self, turn: str) -> StepResult:
        return StepResult(error_text(f"the environment is unavailable: {self.reason}"), done=True)


def _takes_budget(engine: Any) -> bool:
    """Whether the engine's ``generate`` takes a per-call ``max_new_tokens`` (the protocol's
    optional keyword; an engine without it generates to its own cap and the loop cuts)."""
    try:
        params = inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False
    return "max_new_tokens" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _device(model: nn.Module) -> torch.device:
    param = next(iter(model.parameters()), None)
    return torch.device("cpu") if param is None else param.device


def _eos_ids(tokenizer: Any) -> set[int]:
    eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos}


def observation_role(tokenizer: Any) -> str:
    """The chat role environment turns are rendered with for ``tokenizer``: ``tool`` where its
    chat template renders a ``tool`` message, else ``user`` (demonstrations for a warm start use
    the same role, :func:`lit_rlhf.envs.demos.scripted_messages`)."""
    try:
        probe = [{"role": "user", "content": "Q"}, {"role": "tool", "content": "OBS"}]
        if "OBS" in tokenizer.apply_chat_template(probe, tokenize=False):
            return "tool"
    except Exception:  # a template that raises on unknown roles
        pass
    return "user"
