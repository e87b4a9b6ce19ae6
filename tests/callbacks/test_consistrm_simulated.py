"""ConsistRM's temporal consistency with a simulated judge, through the shipped
``ConsistencyAnswerReward`` (issue 40, item 1): does the per-query memory make the pseudo-label
more accurate, and when does it not?

Simulation (numpy and the callback's generator seeded, so every number is fixed):
- N queries, each with a gold verdict and a probability p ~ Beta(6, 4) that the starting judge's
  vote is right (mean 0.6; a quarter of the queries are below 0.5, where more votes only make
  the majority more surely wrong).
- A tabular policy: per query the logit of voting +1, starting at the judge's p. Each epoch it
  casts K votes per query; the shipped callback turns them (as judge texts, parsed by the shipped
  format) into pseudo-labels and per-vote rewards, with its memory, eviction and tie rule; the
  logit then moves by ``step * mean(reward * verdict)``, so the rewarded verdict gains.
- Regimes: ``independent``, every vote drawn afresh from the policy; ``shared``, a vote copies the
  query's persistent answer (drawn once, right with probability p) with probability 0.7, else
  comes from the policy: the errors are correlated and repeat every epoch.
- Arms: ``memory`` (the shipped default, the memory seeded as the authors do with 8 votes of the
  starting judge, through ``initial_memory``), ``no_memory`` (the shipped switch
  ``use_memory=False``, the paper's ablation) and ``majority`` (this round's majority through the
  public ``pseudo_label`` / ``answer_rewards`` with an empty memory, no callback). Arms of one
  seed share the judge's random stream until their pseudo-labels differ.
- 16 epochs, so the memory (8 seed votes + one pseudo-label per epoch) passes the cap of 20 and
  eviction runs in the last four.

Measured (pseudo-label accuracy vs gold, final epoch, mean of 4 seeds; 0 counts as wrong):
independent, slow policy (step 0.05): memory 0.721, no memory 0.659, majority 0.659 (the memory
ahead by 9-12 points over epochs 2-8); shared: 0.595 in all three arms. What the memory buys is
speed: it pools the seed votes with each round's and then holds the label, so it reaches its
ceiling (near the share of queries with p > 0.5) within 2-3 epochs; the tabular policy is itself a
slow memory of past rewards, so without the memory the accuracy climbs towards the same ceiling
as the policy learns. With a fast policy (step 0.5) the memory is 7 points ahead after two epochs
(0.715 vs 0.644) and both arms are at 0.716 from epoch 12. Where errors repeat, the vote is
confidently wrong on the same queries every epoch, and remembering it adds nothing.
Unseeded (``unseeded=True``, not tested here) the memory is worth less: its first entry, one
round's 8-vote majority, outweighs any later round (|s_on| < 1 unless unanimous), so the label
freezes at epoch 1: 0.692 at the slow step, and 0.693 against 0.716 without memory at the fast.
"""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from lit_rlhf.algos.consistency import answer_rewards, pseudo_label
from lit_rlhf.callbacks import ConsistencyAnswerReward, RewardContext, reward_terms

N, K, EPOCHS, SEEDS = 200, 8, 16, (0, 1, 2, 3)
BETA = (6.0, 4.0)
SHARED = 0.7  # shared regime: the share of a query's votes that copy its persistent answer
SLOW, FAST = 0.05, 0.5  # the policy's logit step per epoch
CAP = 20  # the callback's default
QUERIES = [f"q{i}" for i in range(N)]


def judgment(verdict: int) -> str:
    first, second = (1, 2) if verdict == -1 else (2, 1)
    return (
        "<Criterion>correctness</Criterion><Analysis>compared</Analysis>"
        f"<Result>Response {first} is better than Response {second}</Result>"
    )


TEXTS = {-1: judgment(-1), 1: judgment(1)}


@dataclass
class Judge:
    """One seed's simulated judge: gold verdicts, the tabular policy, the persistent answers."""

    regime: str
    rng: np.random.Generator
    gold: np.ndarray = field(init=False)
    logit: np.ndarray = field(init=False)  # [N] logit of voting +1
    persistent: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.gold = self.rng.choice([-1, 1], N)
        right = self.rng.beta(*BETA, N)
        self.persistent = np.where(self.rng.random(N) < right, self.gold, -self.gold)
        p_plus = np.where(self.gold == 1, right, 1 - right)
        self.logit = np.log(p_plus / (1 - p_plus))

    def votes(self) -> np.ndarray:
        """[N, K] verdicts of -1 / +1."""
        plus = self.rng.random((N, K)) < 1 / (1 + np.exp(-self.logit[:, None]))
        votes = np.where(plus, 1, -1)
        if self.regime == "shared":
            votes = np.where(self.rng.random((N, K)) < SHARED, self.persistent[:, None], votes)
        return votes

    def learn(self, votes: np.ndarray, rewards: np.ndarray, step: float) -> None:
        self.logit += step * (rewards * votes).mean(axis=1)


class Shipped:
    """Pseudo-labels and rewards from ``ConsistencyAnswerReward`` through ``reward_terms``."""

    def __init__(self, use_memory: bool, seed_votes: np.ndarray, seed: int, folder: Path) -> None:
        initial = None
        if use_memory:  # the authors' seed: 8 votes of the starting judge per query
            initial = folder / "initial_memory.jsonl"
            rows = [
                {"query_id": q, "labels": v.tolist()}
                for q, v in zip(QUERIES, seed_votes, strict=True)
            ]
            initial.write_text("".join(json.dumps(row) + "\n" for row in rows))
        self.callback = ConsistencyAnswerReward(
            initial_memory=None if initial is None else str(initial),
            use_memory=use_memory,
            seed=seed,
        )
        self.callback.setup(None, None, "fit")
        # the shipped parser, asked once per distinct text (there are two): speed only
        parse = functools.cache(self.callback.format.verdict)
        self.callback.format = SimpleNamespace(verdict=parse)  # type: ignore[assignment]

    def __call__(self, votes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = votes.reshape(-1).tolist()
        n = len(flat)
        ctx = RewardContext(["p"] * n, [TEXTS[v] for v in flat], [{}] * n,
                            [q for q in QUERIES for _ in range(K)], ["judge"] * n,
                            torch.arange(n) // K, torch.zeros(n))  # fmt: skip
        term, _ = reward_terms(SimpleNamespace(callbacks=[self.callback]), None, ctx)
        labels = np.array([self.callback.last_pseudo[q] for q in QUERIES])
        return labels, term.numpy().reshape(N, K)


def majority(votes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This round's majority alone, through the public functions (no callback, no memory)."""
    labels = np.array([pseudo_label(row.tolist(), []) for row in votes])
    rewards = [
        answer_rewards(row.tolist(), y, unparsable=0.0).numpy()
        for row, y in zip(votes, labels, strict=True)
    ]
    return labels, np.stack(rewards)


@dataclass
class Run:
    accuracy: list[float]  # per epoch
    memory_sizes: set[int]  # at the end, over the queries


def simulate(regime: str, arm: str, step: float, seed: int) -> Run:
    judge = Judge(regime, np.random.default_rng(seed))
    seed_votes = judge.votes()  # drawn in every arm, so the arms share the random stream
    with tempfile.TemporaryDirectory() as folder:
        shipped = (
            None if arm == "majority" else Shipped(arm == "memory", seed_votes, seed, Path(folder))
        )
    label_and_reward = majority if shipped is None else shipped
    accuracy = []
    for _ in range(EPOCHS):
        votes = judge.votes()
        labels, rewards = label_and_reward(votes)
        accuracy.append(float((labels == judge.gold).mean()))
        judge.learn(votes, rewards, step)
    sizes = set() if shipped is None else {len(m) for m in shipped.callback.memory.values()}
    return Run(accuracy, sizes)


@functools.cache
def curve(regime: str, arm: str, step: float = SLOW) -> tuple[float, ...]:
    """Pseudo-label accuracy per epoch, the mean over the seeds."""
    runs = [simulate(regime, arm, step, seed).accuracy for seed in SEEDS]
    return tuple(float(x) for x in np.mean(runs, axis=0))


def memory_gain(regime: str, memory_on: bool, step: float = SLOW, epoch: int = -1) -> float:
    """The callback's accuracy at ``epoch`` (default: the last) with the switch ``use_memory`` set
    to ``memory_on``, minus the plain majority's."""
    arm = "memory" if memory_on else "no_memory"
    return curve(regime, arm, step)[epoch] - curve(regime, "majority", step)[epoch]


def test_the_memory_arm_runs_the_shipped_memory_to_its_cap_and_the_switch_keeps_none():
    remembering = simulate("independent", "memory", SLOW, SEEDS[0])
    assert remembering.memory_sizes == {CAP}  # 8 seed votes + 16 pseudo-labels: 4 evictions each
    assert simulate("independent", "no_memory", SLOW, SEEDS[0]).memory_sizes == set()


def test_with_independent_votes_the_memory_makes_the_pseudo_label_more_accurate():
    gain = memory_gain("independent", memory_on=True)
    assert gain > 0.04, curve("independent", "memory")  # measured 0.062 (0.721 vs 0.659)
    # the switch off is this round's majority exactly: the memory, not the callback, is the gain
    assert curve("independent", "no_memory") == curve("independent", "majority")
    assert memory_gain("independent", memory_on=False) == 0.0
    # the memory arm is ahead at every epoch, by 9-12 points over epochs 2-8
    memory, plain = curve("independent", "memory"), curve("independent", "majority")
    assert all(m > p for m, p in zip(memory, plain, strict=True))
    assert min(m - p for m, p in zip(memory[1:8], plain[1:8], strict=True)) > 0.07


def test_when_errors_repeat_the_memory_does_not_help():
    # the shared regime: the same wrong answer wins the vote every epoch; remembering it is moot
    gain = memory_gain("shared", memory_on=True)
    assert -0.02 <= gain <= 0.01, curve("shared", "memory")  # measured 0.0
    assert memory_gain("shared", memory_on=False) == 0.0
    # while the same memory, on independent votes, gains far more
    assert memory_gain("independent", memory_on=True) > gain + 0.05


def test_a_fast_policy_catches_up_with_the_memory():
    """The memory's gain is speed: a policy that learns fast from this round's majority reaches
    the same ceiling (the tabular policy itself remembers past rewards)."""
    assert memory_gain("independent", True, FAST, epoch=1) > 0.04  # measured 0.071 after 2 epochs
    assert abs(memory_gain("independent", True, FAST)) < 0.03  # measured 0.0 at epoch 16
