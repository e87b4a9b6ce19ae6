"""ConsistRM's consistency reward with its memory (``ConsistencyAnswerReward``) in a
LightningModule of your own, through the reward-term protocol (``RewardContext`` +
``reward_terms``), on hand-written judge outputs (no model, CPU, seconds).

Per query, the pseudo-label is the sign of this round's verdicts plus the query's memory of past
pseudo-labels; each judgment gets +1 (agrees) / -1 (disagrees) / 0 (pseudo-label 0), and the
memory keeps at most ``cap`` entries. The memory is seeded from an ``initial_memory`` JSONL whose
row for ``q-memory`` holds 25 labels: with ``cap=20`` only the newest 20 are kept (all -1), and
they outvote this round's majority (+1).

Run: ``python examples/reuse/consistency_reward.py``
"""

from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path

import lightning as L
import torch

from lit_rlhf.callbacks import ConsistencyAnswerReward, RewardContext, reward_terms


def judgment(winner: int) -> str:
    """A well-formed judge output (criterion, analysis, result) for a pair of responses."""
    loser = 3 - winner
    return (
        "<Criterion>helpfulness</Criterion><Analysis>One answer is clearer.</Analysis>"
        f"<Result>Response {winner} is better than Response {loser}</Result>"
    )


# one round = 4 judgments per query; Response 1 better -> label -1, Response 2 -> +1
ROUND = {
    "q-memory": [judgment(2), judgment(2), judgment(2), judgment(1)],  # votes +1 +1 +1 -1
    "q-tie": [judgment(1), judgment(2), judgment(1), judgment(2)],  # -1 +1 -1 +1, no memory
    "q-broken": ["no verdict here"] * 4,  # unreadable: no pseudo-label, memory untouched
}
GOLD = {"q-memory": -1, "q-tie": 1}  # the rows' optional `label`: a diagnostic only


class JudgeStandIn(L.LightningModule):
    """Stands for a judge being trained: each step scores one round of judgments."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.terms: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        query_ids = [q for q, outputs in ROUND.items() for _ in outputs]
        ctx = RewardContext(
            prompts=[f"judge pair {q}" for q in query_ids],
            responses=[r for outputs in ROUND.values() for r in outputs],
            rows=[{"label": GOLD.get(q)} for q in query_ids],  # read: `label`, `subject`
            query_ids=query_ids,  # groups the judgments of one query
            tasks=["preference"] * len(query_ids),
            group_ids=torch.tensor([i for i, o in enumerate(ROUND.values()) for _ in o]),
            scores=torch.zeros(len(query_ids)),  # the injected reward's scores (a format reward)
        )
        extra, stats = reward_terms(self.trainer, self, ctx)  # the protocol
        self.terms.append(extra)
        self.log_dict(stats, batch_size=len(query_ids))

    def train_dataloader(self):
        return [0, 1, 2]  # three rounds

    def configure_optimizers(self):
        return None  # nothing to train in this stand-in


def main() -> dict[str, float]:
    warnings.filterwarnings("ignore", ".*configure_optimizers.*")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    seed = [1] * 5 + [-1] * 20  # oldest first: 5 x +1, then 20 x -1 (25 > cap)
    with tempfile.TemporaryDirectory() as root:
        memory_file = Path(root) / "memory.jsonl"
        memory_file.write_text(json.dumps({"query_id": "q-memory", "labels": seed}) + "\n")
        answer = ConsistencyAnswerReward(
            cap=20, initial_memory=str(memory_file), initial_overflow="newest"
        )
        module = JudgeStandIn()
        trainer = L.Trainer(
            accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
            callbacks=[answer],
        )  # fmt: skip
        trainer.fit(module)

    first = module.terms[0].tolist()
    # q-memory: online mean +0.5, memory mean -1 (the newest 20 are all -1): pseudo-label -1,
    # the memory outvotes this round. (Had the OLDEST 20 been kept, 5 x +1 and 15 x -1, the
    # memory mean -0.5 would tie the round: pseudo-label 0, every term 0.)
    assert first[0:4] == [-1.0, -1.0, -1.0, 1.0], first
    assert first[4:8] == [0.0] * 4, first  # q-tie: -1 +1 -1 +1 and no memory: pseudo-label 0
    assert first[8:12] == [0.0] * 4, first  # q-broken: unreadable, `unparsable` (0) each
    memory = answer.memory
    assert memory["q-memory"] == [-1] * 20, memory  # capped; the 5 oldest were cut at setup
    assert memory["q-tie"] == [0, 0, 0] and "q-broken" not in memory, memory
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert metrics["ConsistencyAnswerReward/supervised_fraction"] == 0.5  # 1 of 2 readable
    assert metrics["ConsistencyAnswerReward/unreadable_queries"] == 1.0
    assert metrics["ConsistencyAnswerReward/flip_rate"] == 0.0  # rounds 2-3: no label flipped
    assert metrics["ConsistencyAnswerReward/pseudo_label_accuracy"] == 1.0  # q-memory: -1
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    metrics["memory_length"] = float(len(memory["q-memory"]))
    return metrics


if __name__ == "__main__":
    m = main()
    print(
        "consistency_reward OK: 3 rounds, memory capped at "
        f"{m['memory_length']:.0f}, supervised_fraction="
        f"{m['ConsistencyAnswerReward/supervised_fraction']:.2f}, unreadable_queries="
        f"{m['ConsistencyAnswerReward/unreadable_queries']:.0f}, "
        f"flip_rate={m['ConsistencyAnswerReward/flip_rate']:.2f}"
    )
