import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.algos import answer_rewards, critique_bonus, pseudo_label, update_memory
from lit_rlhf.algos.consistency import memory_mode


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    ("online", "memory", "expected"),
    [
        # s_on = (1 - 1) / 2 = 0, s_mem = 0 (empty): a tie, no supervision.
        ([1, -1], [], 0),
        # Nothing valid and no memory: 0 + 0.
        ([None, None], [], 0),
        # Unparsable rollouts are left out: s_on = 1, s_mem = 0 -> +1.
        ([None, 1, None], [], 1),
        # Only the memory speaks: s_on = 0 (none valid), s_mem = 1 -> +1.
        ([None], [1], 1),
        # Online and memory disagree, the memory wins:
        # s_on = (1 + 1 - 1) / 3 = 1/3, s_mem = (-1 - 1 - 1 + 1) / 4 = -1/2 -> -1/6 -> -1.
        ([1, 1, -1, None], [-1, -1, -1, 1], -1),
        # ... and the online vote wins: s_on = (1 + 1 + 1 - 1) / 4 = 1/2, s_mem = -1/3 -> +1/6.
        ([1, 1, 1, -1], [-1, -1, 1], 1),
        # An exact tie across the two: s_on = 1/3, s_mem = -1/3 -> 0 (no rounding error).
        ([1, 1, -1], [-1, -1, 1], 0),
        # Zeros in the memory dilute it: s_on = (-1 + 1 - 1) / 3 = -1/3,
        # s_mem = (1 + 0 + 0) / 3 = 1/3 -> 0.
        ([-1, 1, -1], [1, 0, 0], 0),
    ],
)
def test_pseudo_label(online, memory, expected):
    assert pseudo_label(online, memory) == expected


def test_pseudo_label_rejects_bad_labels():
    with pytest.raises(ValueError, match="online"):
        pseudo_label([2], [])
    with pytest.raises(ValueError, match="memory"):
        pseudo_label([1], [5])


def test_tie_gives_no_supervision_and_zero_answer_rewards():
    labels = [1, -1, None, 1, -1]
    # s_on = (1 - 1 + 1 - 1) / 4 = 0, s_mem = (1 - 1) / 2 = 0 -> y = 0.
    pseudo = pseudo_label(labels, [1, -1])
    assert pseudo == 0
    rewards = answer_rewards(labels, pseudo, agree=2.0, disagree=-0.5, unparsable=-3.0)
    assert rewards.dtype == torch.float32
    torch.testing.assert_close(rewards, torch.zeros(5))


def test_answer_rewards_agree_disagree_unparsable():
    labels = [-1, 1, None, -1]
    torch.testing.assert_close(answer_rewards(labels, -1), torch.tensor([1.0, -1.0, -1.0, 1.0]))
    torch.testing.assert_close(
        answer_rewards(labels, 1, agree=2.0, disagree=-0.5, unparsable=-3.0),
        torch.tensor([-0.5, 2.0, -3.0, -0.5]),
    )
    with pytest.raises(ValueError, match="pseudo"):
        answer_rewards(labels, 2)


def test_update_memory_below_cap_appends_without_drawing():
    gen = _gen()
    state = gen.get_state()
    memory = [1, -1]
    assert update_memory(memory, 0, cap=20, generator=gen) == [1, -1, 0]
    assert memory == [1, -1]  # not modified
    assert torch.equal(gen.get_state(), state)


def test_update_memory_evicts_the_entry_farthest_from_the_mode():
    # Mode 1; |-1 - 1| = 2 is the farthest, so the -1 goes and the new 1 comes in.
    assert update_memory([1] * 19 + [-1], 1, cap=20, generator=_gen()) == [1] * 20
    # Mode 1; distances: 0 -> 1, -1 -> 2. One -1 goes (2 -> 1 left), then 0 is appended.
    memory = [1] * 15 + [0] * 3 + [-1] * 2
    updated = update_memory(memory, 0, cap=20, generator=_gen())
    assert len(updated) == 20
    assert Counter(updated) == {1: 15, 0: 4, -1: 1}
    assert updated[-1] == 0


def test_update_memory_breaks_equally_far_ties_with_the_generator():
    # plurality: mode 0; both the +1 and the -1 are 1 away: the generator picks which goes.
    memory = [0] * 18 + [1, -1]
    evicted = set()
    for seed in range(32):
        updated = update_memory(memory, 0, cap=20, generator=_gen(seed), mode_rule="plurality")
        assert Counter(updated)[0] == 19 and len(updated) == 20
        (gone,) = (Counter(memory) - Counter(updated[:-1])).keys()
        assert gone in (1, -1)
        evicted.add(gone)
        # The same seed gives the same choice.
        again = update_memory(memory, 0, cap=20, generator=_gen(seed), mode_rule="plurality")
        assert again == updated
    assert evicted == {1, -1}
    # the authors' rule: one +1 against 19 others -> mode -1, so the +1 (2 away) always goes
    for seed in range(8):
        assert Counter(update_memory(memory, 0, cap=20, generator=_gen(seed))) == {0: 19, -1: 1}


@pytest.mark.parametrize(
    ("memory", "mode"),
    [
        ([1, 0, -1], -1),  # one +1 against two others: the 0 counts with the -1
        ([1, 1, 0, -1], 0),  # two against two: a tie gives 0
        ([1, 1, 0], 1),
        ([0, 0, 0], -1),  # all zeros: nothing is +1
        ([], 0),
    ],
)
def test_memory_mode_by_the_authors_rule(memory, mode):
    gen = _gen()
    state = gen.get_state()
    assert memory_mode(memory, rule="authors", generator=gen) == mode
    assert torch.equal(gen.get_state(), state)  # never drawn from


def test_the_authors_mode_rule_and_plurality_evict_differently():
    # 8 zeros, 4 -1, 8 +1. Authors: 8 +1 against 12 others -> mode -1, a +1 (2 away) goes.
    memory = [0] * 8 + [-1] * 4 + [1] * 8
    for seed in range(16):
        updated = update_memory(memory, -1, cap=20, generator=_gen(seed))
        assert Counter(updated) == {0: 8, -1: 5, 1: 7}
    # Plurality: 0 and +1 tie (8 each); mode +1 evicts a -1, mode 0 a +1 or a -1.
    outcomes = {
        tuple(sorted(Counter(update_memory(memory, -1, cap=20, generator=_gen(seed),
                                           mode_rule="plurality")).items()))
        for seed in range(64)
    }  # fmt: skip
    assert ((-1, 4), (0, 8), (1, 8)) in outcomes  # a -1 evicted: not possible by the authors' rule
    # A tie under the authors' rule (ten +1, ten 0) gives mode 0: a +1 goes, never a 0.
    for seed in range(16):
        assert Counter(update_memory([1] * 10 + [0] * 10, 0, cap=20, generator=_gen(seed))) == {
            1: 9, 0: 11
        }  # fmt: skip
    with pytest.raises(ValueError, match="mode_rule"):
        update_memory([1], 1, generator=_gen(), mode_rule="median")  # type: ignore[arg-type]


def test_update_memory_breaks_a_tied_mode_with_the_generator():
    # Ten +1 and ten -1. Authors: a tie, mode 0, every entry is 1 away: any one goes.
    # Plurality: mode +1 drops a -1, mode -1 drops a +1. Both rules: both outcomes across seeds.
    memory = [1] * 10 + [-1] * 10
    for rule in ("authors", "plurality"):
        outcomes = {
            Counter(update_memory(memory, 1, cap=20, generator=_gen(seed), mode_rule=rule))[1]
            for seed in range(32)
        }
        # Dropped a -1: 10 + 1 = 11 ones; dropped a +1: 9 + 1 = 10 ones.
        assert outcomes == {10, 11}


def test_update_memory_appends_zero_and_respects_small_caps():
    assert update_memory([1, 1], 0, cap=20, generator=_gen()) == [1, 1, 0]
    assert update_memory([1], -1, cap=1, generator=_gen()) == [-1]
    # A memory above a (lowered) cap is cut to cap - 1 before the append: mode 1 drops both -1.
    assert update_memory([1, -1, 1, -1, 1], 1, cap=4, generator=_gen()) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="cap"):
        update_memory([], 1, cap=0, generator=_gen())
    with pytest.raises(ValueError, match="labels"):
        update_memory([], 3, generator=_gen())


def test_critique_bonus_hand_case():
    # Unnormalised on purpose: [2, 0] -> [1, 0], [3, 4] -> [0.6, 0.8], [0, 0.5] -> [0, 1].
    embeddings = torch.tensor([[2.0, 0.0], [3.0, 4.0], [0.0, 0.5], [1.0, 0.0], [-2.0, 0.0]])
    rewards = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0])
    bonus, consistency = critique_bonus(embeddings, rewards)
    # +1 sub-group {0, 1, 2}: cos01 = 0.6, cos02 = 0, cos12 = 0.8
    #   c0 = (0.6 + 0) / 2 = 0.3, c1 = (0.6 + 0.8) / 2 = 0.7, c2 = (0 + 0.8) / 2 = 0.4.
    # -1 sub-group {3, 4}: cos34 = -1 -> c3 = c4 = -1.
    torch.testing.assert_close(consistency, torch.tensor([0.3, 0.7, 0.4, -1.0, -1.0]))
    # n = 3 -> ceil(3/2) = 2 most consistent +1 rollouts: 1 (0.7) and 2 (0.4).
    torch.testing.assert_close(bonus, torch.tensor([0.0, 0.1, 0.1, 0.0, 0.0]))


def test_critique_bonus_alone_is_fully_consistent_and_ties_go_to_the_lower_index():
    embeddings = torch.ones(5, 3)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])
    bonus, consistency = critique_bonus(embeddings, rewards, bonus=0.5)
    # Rollout 1 is alone in its sub-group -> 1.0; the others are identical -> cos = 1.
    torch.testing.assert_close(consistency, torch.ones(5))
    # n = 4 -> 2 winners, all tied at 1.0 -> the lowest indices 0 and 2.
    torch.testing.assert_close(bonus, torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0]))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_critique_bonus_goes_to_ceil_half_of_the_positive_sub_group_only(n):
    embeddings = torch.randn(8, 16, generator=_gen(n))
    rewards = torch.tensor([1.0] * n + [-1.0, 0.0] * 4)[:8]
    bonus, _ = critique_bonus(embeddings, rewards)
    # n = 0, 1, 2, 3, 5 -> 0, 1, 1, 2, 3 winners.
    assert int((bonus == 0.1).sum()) == math.ceil(n / 2)
    assert (bonus[rewards != 1.0] == 0).all()


def _loop_consistency(embeddings: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    unit = embeddings / embeddings.norm(dim=-1, keepdim=True)
    out = []
    for i in range(len(rewards)):
        peers = [j for j in range(len(rewards)) if j != i and rewards[j] == rewards[i]]
        sims = [float(unit[i] @ unit[j]) for j in peers]
        out.append(sum(sims) / len(sims) if sims else 1.0)
    return torch.tensor(out)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rewards=st.lists(st.sampled_from([1.0, -1.0, 0.0]), min_size=1, max_size=10),
    dim=st.integers(1, 6),
)
def test_critique_bonus_properties(seed, rewards, dim):
    embeddings = torch.randn(len(rewards), dim, generator=_gen(seed), dtype=torch.float64)
    reward_tensor = torch.tensor(rewards)
    bonus, consistency = critique_bonus(embeddings, reward_tensor, bonus=0.1)
    positive = reward_tensor == 1.0
    winners = bonus == 0.1
    assert int(winners.sum()) == math.ceil(int(positive.sum()) / 2)
    assert not (winners & ~positive).any()
    assert ((bonus == 0) | winners).all()
    # Every winner is at least as consistent as every positive loser.
    if winners.any() and (positive & ~winners).any():
        assert consistency[winners].min() >= consistency[positive & ~winners].max()
    # The vectorised consistency equals the loop over sub-groups.
    torch.testing.assert_close(
        consistency, _loop_consistency(embeddings, reward_tensor).float(), atol=1e-5, rtol=0
    )


def test_critique_bonus_reads_without_gradient_and_checks_shapes():
    embeddings = torch.randn(3, 4, requires_grad=True)
    bonus, consistency = critique_bonus(embeddings, torch.tensor([1.0, 1.0, -1.0]))
    assert not bonus.requires_grad and not consistency.requires_grad
    with pytest.raises(ValueError, match="embeddings"):
        critique_bonus(embeddings, torch.ones(2))
