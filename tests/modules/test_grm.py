"""The generative reward model: the judge reward, the evaluation metrics, and a few GRPO steps of
a tiny judge in both modes."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.callbacks import ConsistencyAnswerReward, CritiqueConsistencyReward
from lit_rlhf.data import PromptDataModule, SyntheticPairs
from lit_rlhf.metrics import JudgeMetrics, majority_verdict
from lit_rlhf.modules import GenerativeRewardModule
from lit_rlhf.rewards.verdict import VerdictReward
from lit_rlhf.types import GenerationOutput
from tests.helpers import merge_groups, quiet_trainer

GOOD_1 = (
    "<Criterion>c</Criterion><Analysis>a</Analysis>"
    "<Result>Response 1 is better than Response 2</Result>"
)
GOOD_2 = GOOD_1.replace(
    "Response 1 is better than Response 2", "Response 2 is better than Response 1"
)
BROKEN = "<Criterion>c</Criterion><Analysis>a"


def test_judge_reward_gold_and_format_modes():
    rows = [{"label": -1}, {"label": -1}, {"label": 1}]
    gold = VerdictReward(mode="gold")([""] * 3, [GOOD_1, GOOD_2, BROKEN], rows)
    # right verdict: 0.1 + 1; wrong verdict: 0.1 - 1; broken: -3 whatever the label
    assert gold.scores.tolist() == pytest.approx([1.1, -0.9, -3.0])
    assert gold.info["correct"].tolist() == [1.0, 0.0, 0.0]
    assert gold.info["format_ok"].tolist() == [1.0, 1.0, 0.0]
    assert gold.info["verdict"].tolist() == [-1.0, 1.0, 0.0]
    label_free = VerdictReward(mode="format")([""] * 3, [GOOD_1, GOOD_2, BROKEN], [{}] * 3)
    assert label_free.scores.tolist() == pytest.approx([0.1, 0.1, -3.0])
    assert "correct" not in label_free.info
    with pytest.raises(ValueError, match="needs -1 \\(response 1 better\\) or \\+1"):
        VerdictReward(mode="gold")([""], [GOOD_1], [{"label": None}])
    with pytest.raises(ValueError, match="else a malformed output pays"):
        VerdictReward(invalid=0.5)


def test_judge_metrics_hand_case():
    metrics = JudgeMetrics()
    # family A shown in both orders, judged right both times; family B right once, wrong once;
    # family C shown once (not counted for positional consistency)
    metrics.update(
        votes=[[-1], [1], [-1], [-1], [None, None]],
        labels=[-1, 1, 1, -1, 1],
        families=["A", "A", "B", "B", "C"],
        subsets=["math", "math", "chat", "chat", ""],
    )
    out = metrics.compute()
    assert float(out["accuracy"]) == pytest.approx(3 / 5)
    assert float(out["positional_consistency"]) == pytest.approx(1 / 2)  # A yes, B no
    assert float(out["format_valid"]) == pytest.approx(4 / 6)  # 6 samples, C's two invalid
    assert float(out["tie_rate"]) == pytest.approx(1 / 5)  # C: no valid vote
    assert float(out["accuracy/math"]) == 1.0 and float(out["accuracy/chat"]) == 0.5
    assert majority_verdict([1, -1, None]) == 0 and majority_verdict([1, 1, -1]) == 1


def data(**pairs):
    return PromptDataModule(
        tokenizer="builtin:tiny-llama",
        train=SyntheticPairs(num_examples=8, seed=0, template="consistrm-v1-short", **pairs),
        val=SyntheticPairs(num_examples=2, seed=1, template="consistrm-v1-short", swap="both"),
        batch_size=2,
        max_prompt_length=1024,
    )


class ScriptedJudgeEngine:
    """Returns one of four judge outputs per row (right-looking, wrong-looking, the other verdict,
    malformed), seeded by the call count: rewards then vary within every group, so GRPO has a
    signal even though a random tiny network never writes the format itself."""

    temperature = 1.0
    texts = (GOOD_1, GOOD_2, GOOD_1.replace("a</Analysis>", "longer analysis</Analysis>"), BROKEN)

    def __init__(self):
        self.calls = 0

    def generate(self, model, input_ids, attention_mask, tokenizer, *, greedy, log_probs=True):
        gen = torch.Generator().manual_seed(self.calls)
        self.calls += 1
        picks = torch.randint(len(self.texts), (len(input_ids),), generator=gen).tolist()
        rows = [tokenizer(self.texts[i], add_special_tokens=False).input_ids for i in picks]
        rows = [[*r, tokenizer.eos_token_id] for r in rows]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), True
        return GenerationOutput(ids, mask, None)

    def sync_weights(self, model):
        pass


def judge(mode, **kwargs):
    defaults = dict(
        mode=mode,
        model="builtin:tiny-llama",
        engine=ScriptedJudgeEngine(),
        rollout={"samples_per_prompt": 4},
        optim={"lr": 1e-3},
    )
    return GenerativeRewardModule(**merge_groups(defaults, kwargs))


@pytest.mark.parametrize("mode", ["rft", "consistrm"])
def test_a_tiny_judge_trains_and_is_evaluated(tmp_path, mode):
    module = judge(mode)
    callbacks = []
    if mode == "consistrm":
        callbacks = [
            ConsistencyAnswerReward(unseeded=True),
            CritiqueConsistencyReward("builtin:tiny-llama"),
        ]
    trainer = quiet_trainer(
        tmp_path, limit_train_batches=2, limit_val_batches=2, callbacks=callbacks
    )
    module.configure_model()
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    trainer.fit(module, datamodule=data())
    unchanged = [n for n, p in module.policy.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, unchanged
    metrics = trainer.callback_metrics
    for key in ("val/accuracy", "val/positional_consistency", "val/format_valid", "val/tie_rate"):
        assert key in metrics, sorted(metrics)
    assert "reward/format_ok" in metrics and module.rollout_step == 2
    if mode == "consistrm":
        assert "ConsistencyAnswerReward/supervised_fraction" in metrics
        assert "CritiqueConsistencyReward/embed_seconds" in metrics
    predictions = trainer.predict(module, datamodule=data())
    assert predictions and {"query_id", "votes", "verdict"} <= predictions[0][0].keys()


def test_consistrm_without_its_callbacks_is_refused(tmp_path):
    with pytest.raises(ValueError, match="trainer has none"):
        quiet_trainer(tmp_path, limit_train_batches=1).fit(judge("consistrm"), datamodule=data())


def test_bad_settings_are_refused_at_construction():
    with pytest.raises(ValueError, match="mode must be"):
        GenerativeRewardModule(mode="dpo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"clip_low=1.5 must be in \(0, 1\)"):
        GenerativeRewardModule(loss={"clip_low": 1.5})
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        GenerativeRewardModule(rollout={"samples_per_prompt": 1})


def test_the_response_prefix_reaches_the_default_reward():
    module = GenerativeRewardModule(
        judge={"tags": ("Result",), "response_prefix": " <Result>Response"}
    )
    completion = " 2 is better than Response 1</Result>"
    out = module.rollouts.reward(
        ["p"] * 2, [completion, completion + " trailing"], [{"label": 1}] * 2
    )
    # parsed with the prefix: right verdict; text after </Result> is malformed (authors' rule)
    assert out.scores.tolist() == pytest.approx([1.1, -3.0])


def test_recomputed_old_log_probs_and_dual_clip_reach_the_update():
    # the ConsistRM presets: two optimizer steps per rollout on vLLM, verl's dual clip (c = 3)
    module = GenerativeRewardModule(
        rollout={"samples_per_prompt": 8},
        update={"mini_batch_size": 32, "recompute_old_log_probs": True},
        loss={"dual_clip": 3.0},
    )
    assert module.settings.update.recompute_old_log_probs and module.settings.loss.dual_clip == 3.0
    assert not module.settings.single_update(64)  # 64 sequences, 32 per step: two steps
    # the engine's log-probs are not asked for: the trainer's forward computes them
    assert not module.rl.needs_sample_log_probs(module, 64)
    plain = GenerativeRewardModule(
        rollout={"samples_per_prompt": 8}, update={"mini_batch_size": 32}
    )
    assert plain.rl.needs_sample_log_probs(plain, 64)  # without it, the engine's are read
    with pytest.raises(ValueError, match="dual_clip"):
        GenerativeRewardModule(loss={"dual_clip": 0.5})


def test_a_one_word_verdict_after_the_short_template_prefix():
    # verdict-short-v1 + prefix "<Result>Response 1 is": "better" and "worse" end alike
    reward = VerdictReward(tags=("Result",), prefix=" <Result>Response 1 is", format_bonus=0.0)
    outs = [" better than Response 2</Result>", " worse than Response 2</Result>", " better"]
    scored = reward(["p"] * 3, outs, [{"label": 1}] * 3)
    assert scored.info["verdict"].tolist() == [-1.0, 1.0, 0.0]
    assert scored.scores.tolist() == pytest.approx([-1.0, 1.0, -3.0])


def test_a_reward_that_reads_outputs_differently_from_the_evaluation_is_refused():
    reward = VerdictReward(tags=("Result",), prefix=" <Result>Response 1 is", suffix=" than R 2")
    with pytest.raises(ValueError, match=r"the module evaluates them as .*response_suffix"):
        GenerativeRewardModule(
            judge={"tags": ("Result",), "response_prefix": " <Result>Response 1 is"}, reward=reward
        )
    same = GenerativeRewardModule(
        judge={
            "tags": ("Result",),
            "response_prefix": " <Result>Response 1 is",
            "response_suffix": " than R 2",
        },
        reward=reward,
    )
    assert same.judge_format.verdict(" worse") is None  # "R 2" is not the subject "Response"
