"""ReflectRM's two-stage reflective inference on hand-written judge outputs (no model, CPU,
seconds): the helpers of ``lit_rlhf.algos`` pick the most reliable of N sampled judgments (the
anchor: :func:`confidence` + :func:`select_anchor`), read each analysis, and let the judgments
whose analysis beat the anchor's vote (:func:`reflective_vote`).

With your own judge, stage 1 is N sampled judgments of a pair with their token log-probs, and
stage 2 one greedy judgment per other readable sample of the prompt built by
``render_reflection_prompt`` (written out below, answered by hand).

Run: ``python examples/reuse/reflective_inference.py``
"""

from __future__ import annotations

import torch

from lit_rlhf.algos import (
    JudgeFormat,
    analysis_text,
    confidence,
    reflective_vote,
    select_anchor,
)
from lit_rlhf.data import render_reflection_prompt
from lit_rlhf.metrics import majority_verdict

QUERY = "How do I boil an egg?"
RESPONSE_1 = "Put it in water."
RESPONSE_2 = "Lower it into boiling water for 9 minutes, then cool it in cold water."


def judgment(analysis: str, winner: int) -> str:
    return (
        f"<Criterion>completeness</Criterion><Analysis>{analysis}</Analysis>"
        f"<Result>Response {winner} is better than Response {3 - winner}</Result>"
    )


def reflection(better: int) -> str:
    """A stage-2 judgment: which of two critiques (analyses) of the pair is better."""
    return (
        "<Criterion>accuracy</Criterion><Analysis>One critique checks more.</Analysis>"
        f"<Result>Critique {better} is better than Critique {3 - better}</Result>"
    )


# stage 1: N = 6 sampled judgments (Response 1 better -> -1, Response 2 better -> +1)
SAMPLES = [
    judgment("Response 1 is shorter.", 1),
    judgment("Response 1 is simpler.", 1),
    judgment("Both work; the first is brief.", 1),
    judgment("Response 2 gives the time and the cooling step; Response 1 omits both.", 2),
    judgment("Response 2 is complete.", 2),
    "I cannot decide.",  # unreadable: neither anchor nor voter
]
# each sample's token log-probs [N, T] and mask: sample 3 is the most confident (its lowest 10 %
# of tokens are the most likely)
LOG_PROBS = torch.tensor(
    [[-2.0, -0.1, -0.2, -0.3], [-1.5, -0.1, -0.1, -0.1], [-2.5, -0.2, -0.2, 0.0],
     [-0.4, -0.1, -0.1, -0.2], [-0.9, -0.3, -0.1, -0.1], [-0.1, -0.1, -0.1, -0.1]]
)  # fmt: skip
MASK = torch.ones_like(LOG_PROBS, dtype=torch.bool)


def main() -> dict[str, object]:
    judge = JudgeFormat()  # tags Criterion / Analysis / Result, subject "Response"
    votes = [judge.verdict(text) for text in SAMPLES]  # None: malformed or unparsable
    assert votes == [-1, -1, -1, 1, 1, None], votes

    # the anchor: the most confident READABLE sample (unreadable ones masked out)
    conf = confidence(LOG_PROBS, MASK, lowest_fraction=0.1)
    readable = torch.tensor([v is not None for v in votes])
    anchor = select_anchor(conf.masked_fill(~readable, float("-inf")))
    assert anchor == 3, (anchor, conf)

    # stage 2: each other readable analysis against the anchor's (candidate shown first here)
    critic = JudgeFormat(subject="Critique")  # reads "Critique 1 is better than Critique 2"
    # your judge's greedy answers to the prompts below, written by hand
    reflections = {0: reflection(2), 1: reflection(2), 2: reflection(2), 4: reflection(1)}
    winners = []
    for k, answer in reflections.items():
        prompt = render_reflection_prompt(
            "reflectrm-critique-v1", prompt=QUERY, response_1=RESPONSE_1,
            response_2=RESPONSE_2, critique_1=analysis_text(SAMPLES[k]),
            critique_2=analysis_text(SAMPLES[anchor]),
        )  # fmt: skip
        assert analysis_text(SAMPLES[anchor]) in prompt
        if critic.verdict(answer) == -1:  # Critique 1 (the candidate) is better
            winners.append(k)
    assert winners == [4], winners

    # the vote over readable samples only (indices into that list)
    kept = [i for i, v in enumerate(votes) if v is not None]
    final = reflective_vote(
        [int(votes[i] or 0) for i in kept], [kept.index(w) for w in winners], kept.index(anchor)
    )
    majority = majority_verdict(votes)
    assert (majority, final) == (-1, 1), (majority, final)  # reflection overturns the majority
    return {"anchor": anchor, "winners": winners, "majority": majority, "reflective": final}


if __name__ == "__main__":
    r = main()
    print(
        f"reflective_inference OK: anchor={r['anchor']}, winners={r['winners']}, "
        f"majority={r['majority']:+d}, reflective={r['reflective']:+d}"
    )
