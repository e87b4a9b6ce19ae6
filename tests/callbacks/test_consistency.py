"""ConsistRM's reward-term callbacks with a plain LightningModule written here that adopts the
reward-term protocol in two lines; the memory survives a resume exactly."""

from __future__ import annotations

import json
import zlib
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lit_rlhf.algos import judge_verdict
from lit_rlhf.callbacks import (
    ConsistencyAnswerReward,
    CritiqueConsistencyReward,
    RewardContext,
    reward_terms,
)
from tests.helpers import quiet_trainer

QUERIES = [f"q{i}" for i in range(6)]
K = 4


def judge_text(verdict: int | None, critique: str = "the analysis") -> str:
    if verdict is None:
        return "<Criterion>c</Criterion><Analysis>unfinished"
    first, second = (1, 2) if verdict == -1 else (2, 1)
    return (
        f"<Criterion>correctness</Criterion><Analysis>{critique}</Analysis>"
        f"<Result>Response {first} is better than Response {second}</Result>"
    )


def outputs_for(query: str, step: int) -> list[str]:
    """K judge outputs that depend only on (query, step): mostly +1 for even queries."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{query}/{step}".encode()))
    lean = 1 if int(query[1:]) % 2 == 0 else -1
    draws = torch.rand(K, generator=gen).tolist()
    return [judge_text(None if d < 0.1 else (lean if d < 0.75 else -lean)) for d in draws]


class PlainJudgeTrainer(L.LightningModule):
    """Scores fixed judge outputs with whatever reward terms the trainer's callbacks add."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.rewards: list[list[float]] = []

    def training_step(self, batch, batch_idx):
        queries = [q for q in batch for _ in range(K)]
        responses = [t for q in batch for t in outputs_for(q, self.global_step)]
        n = len(queries)
        ctx = RewardContext(["p"] * n, responses, [{"label": 1}] * n, queries, ["judge"] * n,
                            torch.arange(n) // K, torch.zeros(n))  # fmt: skip
        extra, stats = reward_terms(self.trainer, self, ctx)  # the protocol, line 1
        scores = ctx.scores + extra  # line 2
        self.rewards.append(scores.tolist())
        self.log_dict(stats)
        return self.w.sum() * 0.0 + scores.mean().detach()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    return DataLoader(QUERIES, batch_size=3, shuffle=False, collate_fn=list)


def test_answer_reward_follows_the_pseudo_label_and_fills_the_memory(tmp_path):
    callback = ConsistencyAnswerReward(cap=3, unseeded=True)
    module = PlainJudgeTrainer()
    quiet_trainer(tmp_path, max_epochs=4, callbacks=[callback]).fit(module, loader())
    assert set(callback.memory) == set(QUERIES)
    assert all(len(m) == 3 for m in callback.memory.values())  # one entry per epoch, capped at 3
    # the memory is self-reinforcing: once a query has a full memory, s_mem = +-1 outweighs any
    # online mean in (-1, 1), so the pseudo-label stays, and so does the memory
    assert all(len(set(m)) == 1 for m in callback.memory.values())
    # last epoch (steps 6 and 7): +1 for a verdict equal to the memory's label, -1 for the other,
    # 0 for an unparsable output (the format reward penalises those)
    for step, batch in ((6, QUERIES[:3]), (7, QUERIES[3:])):
        expected = []
        for query in batch:
            label = callback.memory[query][0]
            for text in outputs_for(query, step):
                verdict = judge_verdict(text)
                expected.append(0.0 if verdict is None else (1.0 if verdict == label else -1.0))
        assert module.rewards[step] == expected


def test_memory_after_resume_equals_the_uninterrupted_run(tmp_path):
    full_cb, full = ConsistencyAnswerReward(cap=4, seed=3, unseeded=True), PlainJudgeTrainer()
    quiet_trainer(tmp_path / "a", max_epochs=3, callbacks=[full_cb]).fit(full, loader())

    first_cb, first = ConsistencyAnswerReward(cap=4, seed=3, unseeded=True), PlainJudgeTrainer()
    trainer = quiet_trainer(tmp_path / "b", max_epochs=1, callbacks=[first_cb])
    trainer.fit(first, loader())  # 2 steps (one epoch)
    ckpt = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=False)["callbacks"]
    assert any("memory" in state for state in saved.values())

    resumed_cb, resumed = ConsistencyAnswerReward(cap=4, seed=3, unseeded=True), PlainJudgeTrainer()
    quiet_trainer(tmp_path / "c", max_epochs=3, callbacks=[resumed_cb]).fit(
        resumed, loader(), ckpt_path=ckpt
    )
    assert resumed_cb.memory == full_cb.memory
    assert resumed_cb.last_pseudo == full_cb.last_pseudo
    assert resumed.rewards == full.rewards[2:]  # steps 3-6: identical rewards
    assert torch.equal(resumed_cb.generator.get_state(), full_cb.generator.get_state())


def test_initial_memory_seeds_and_bad_rows_are_named(tmp_path):
    good = tmp_path / "seed.jsonl"
    good.write_text(json.dumps({"query_id": "q1", "labels": [-1, -1, -1, -1, -1]}) + "\n")
    callback = ConsistencyAnswerReward(initial_memory=str(good), cap=20)
    quiet_trainer(tmp_path, max_steps=1, callbacks=[callback]).fit(PlainJudgeTrainer(), loader())
    # q1's outputs lean -1 anyway; the seeded -1s stay and one pseudo-label is appended
    assert callback.memory["q1"][:5] == [-1] * 5 and len(callback.memory["q1"]) == 6
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query_id": "q1", "labels": [2]}\n')
    bad_seed = ConsistencyAnswerReward(initial_memory=str(bad))
    with pytest.raises(ValueError, match=r"bad.jsonl line 1: 'labels' must be a list of -1 / 0"):
        quiet_trainer(tmp_path, max_steps=1, callbacks=[bad_seed]).fit(
            PlainJudgeTrainer(), loader()
        )
    with pytest.raises(FileNotFoundError, match="is not a file"):
        ConsistencyAnswerReward(initial_memory=str(tmp_path / "missing.jsonl"))


def test_critique_bonus_needs_the_answer_reward_first():
    ctx = RewardContext(["p"] * 2, [judge_text(1)] * 2, [{}] * 2, ["q", "q"], ["j"] * 2,
                        torch.zeros(2, dtype=torch.long), torch.zeros(2))  # fmt: skip

    trainer = SimpleNamespace(callbacks=[CritiqueConsistencyReward(embedder="builtin:tiny-llama")])
    with pytest.raises(ValueError, match="list ConsistencyAnswerReward before"):
        reward_terms(trainer, None, ctx)


def test_critique_bonus_goes_to_half_of_the_agreeing_rollouts():
    # one query, 4 rollouts: three agree with the +1 majority, one dissents
    texts = [judge_text(1, "same words here"), judge_text(1, "same words here"),
             judge_text(1, "totally different critique text"), judge_text(-1, "x")]  # fmt: skip
    ctx = RewardContext(["p"] * 4, texts, [{}] * 4, ["q"] * 4, ["j"] * 4,
                        torch.zeros(4, dtype=torch.long), torch.zeros(4))  # fmt: skip

    critique = CritiqueConsistencyReward(embedder="builtin:tiny-llama", bonus=0.1)
    trainer = SimpleNamespace(callbacks=[ConsistencyAnswerReward(), critique])
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as under precision: bf16-mixed
        extra, stats = reward_terms(trainer, None, ctx)
    assert extra.dtype == torch.float32
    answer = torch.tensor([1.0, 1.0, 1.0, -1.0])
    bonus = extra - answer
    assert (bonus > 0).sum() == 2  # ceil(3 / 2) of the +1 sub-group
    assert bonus[3] == 0  # never the dissenting rollout
    assert bonus[:2].tolist() == pytest.approx([0.1, 0.1])  # the two identical critiques agree
    assert float(stats["ConsistencyAnswerReward/supervised_fraction"]) == 1.0


def _ctx(texts: list[str], queries: list[str]) -> RewardContext:
    n = len(texts)
    groups = torch.tensor([sorted(set(queries)).index(q) for q in queries])
    return RewardContext(["p"] * n, texts, [{}] * n, queries, ["j"] * n, groups, torch.zeros(n))


def test_the_all_unreadable_round_does_not_grow_the_memory():
    # q0's memory says +1; this round none of its 4 rollouts is readable. The authors skip the
    # update; appending sign(0 + s_mem) = +1 would let the memory reinforce itself unseen.
    callback = ConsistencyAnswerReward(unparsable=-1.0)
    callback.memory = {"q0": [1, 1], "q1": [1, 1]}
    callback.last_pseudo = {"q0": 1}
    texts = [judge_text(None)] * 4 + [judge_text(-1)] * 3 + [judge_text(None)]
    trainer = SimpleNamespace(callbacks=[callback])
    extra, stats = reward_terms(trainer, None, _ctx(texts, ["q0"] * 4 + ["q1"] * 4))
    assert callback.memory["q0"] == [1, 1]  # unchanged
    assert callback.last_pseudo["q0"] == 1  # no pseudo-label this round
    # q1: s_on = -1, s_mem = +1 -> y = 0, appended; nobody supervised there
    assert callback.memory["q1"] == [1, 1, 0]
    # unreadable q0 rollouts: the unparsable reward; q1 (y = 0): nothing
    assert extra.tolist() == [-1.0] * 4 + [0.0] * 4
    assert float(stats["ConsistencyAnswerReward/unreadable_queries"]) == 1.0
    assert float(stats["ConsistencyAnswerReward/supervised_fraction"]) == 0.0


def test_a_full_memory_evicts_by_the_authors_mode_rule():
    # 8 zeros, 4 -1, 8 +1: +1 is 8 of 20, so the authors' mode is -1 and a +1 goes
    memory = [0] * 8 + [-1] * 4 + [1] * 8
    callback = ConsistencyAnswerReward()
    callback.memory = {"q": list(memory)}
    trainer = SimpleNamespace(callbacks=[callback])
    reward_terms(trainer, None, _ctx([judge_text(-1)] * 4, ["q"] * 4))  # y = sign(-1 - 0) = -1
    assert sorted(callback.memory["q"]) == sorted([0] * 8 + [-1] * 5 + [1] * 7)
    with pytest.raises(ValueError, match="mode_rule must be one of"):
        ConsistencyAnswerReward(mode_rule="median")  # type: ignore[arg-type]


def test_the_critique_embedding_reads_the_whole_response_or_the_critique():
    seen: list[list[str]] = []

    class Recorder:
        def __call__(self, texts: list[str]) -> torch.Tensor:
            seen.append(texts)
            return torch.ones(len(texts), 2)

    think = "<think>\n\n</think>\n\n"
    texts = [think + judge_text(1, "a"), judge_text(1, "b")]
    for mode in ("response", "critique"):
        critique = CritiqueConsistencyReward(embedder="builtin:tiny-llama", text=mode)
        critique.embedder = Recorder()  # type: ignore[assignment]
        trainer = SimpleNamespace(callbacks=[ConsistencyAnswerReward(), critique])
        reward_terms(trainer, None, _ctx(texts, ["q", "q"]))
    whole, before_result = seen
    assert whole == [judge_text(1, "a"), judge_text(1, "b")]  # the think trace removed
    assert before_result == [
        "<Criterion>correctness</Criterion><Analysis>a</Analysis>",
        "<Criterion>correctness</Criterion><Analysis>b</Analysis>",
    ]


def test_without_memory_the_pseudo_label_is_this_rounds_vote_alone(tmp_path):
    # the "w/o memory" ablation: q0 votes 3 x -1, 1 x +1 -> y = -1 on both rounds, whatever
    # a memory would have said; nothing is remembered
    callback = ConsistencyAnswerReward(use_memory=False)
    trainer = SimpleNamespace(callbacks=[callback])
    texts = [judge_text(-1)] * 3 + [judge_text(1)]
    for _ in range(2):
        extra, _ = reward_terms(trainer, None, _ctx(texts, ["q0"] * 4))
        assert extra.tolist() == [1.0, 1.0, 1.0, -1.0]
    assert callback.memory == {}
    # with a memory of four +1 the same round gives y = sign(-0.5 + 1) = +1
    remembering = ConsistencyAnswerReward()
    remembering.memory = {"q0": [1, 1, 1, 1]}
    extra, _ = reward_terms(SimpleNamespace(callbacks=[remembering]), None, _ctx(texts, ["q0"] * 4))
    assert extra.tolist() == [-1.0, -1.0, -1.0, 1.0]
    seed = tmp_path / "seed.jsonl"
    seed.write_text('{"query_id": "q0", "labels": [1]}\n')
    with pytest.raises(ValueError, match="use_memory=False keeps no memory"):
        ConsistencyAnswerReward(use_memory=False, initial_memory=str(seed))


def test_an_initial_memory_over_the_cap_is_cut_as_initial_overflow_says(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import warnings

    from lit_rlhf.callbacks.consistency import read_memory

    path = tmp_path / "memory.jsonl"
    labels = [1] * 5 + [-1] * 20  # oldest first
    path.write_text(json.dumps({"query_id": "q", "labels": labels}) + "\n")
    with pytest.warns(
        UserWarning, match=r"1 rows hold more than cap=20 labels; each keeps its last"
    ):
        assert read_memory(str(path), cap=20) == {"q": [-1] * 20}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # evict: no warning, the training-time rule
        evicted = read_memory(str(path), cap=20, overflow="evict")
    # each label past the cap first drops one entry farthest from the mode: the +1s go first
    assert evicted == {"q": [-1] * 20}
    mixed = [-1] * 19 + [1] * 3  # the mode stays -1: the late +1s evict each other, last one kept
    path.write_text(json.dumps({"query_id": "q", "labels": mixed}) + "\n")
    assert read_memory(str(path), cap=20, overflow="evict")["q"] == [-1] * 19 + [1]
    assert read_memory(str(path), cap=20, overflow="newest")["q"] == [-1] * 17 + [1] * 3
    with pytest.raises(ValueError, match=r"line 1: 22 labels for query 'q', above cap=20"):
        read_memory(str(path), cap=20, overflow="error")
    with pytest.raises(ValueError, match="initial_overflow must be"):
        ConsistencyAnswerReward(initial_overflow="oldest")  # type: ignore[arg-type]
