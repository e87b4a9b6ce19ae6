"""Faithfulness probes: deterministic per seed, every item's expected answer holds in its own
context, and hand-made reconstructions (overwritten, swapped, negation flipped, empty) score as
they should."""

from __future__ import annotations

import json
import re

import pytest

from lit_rlhf.data.probes import make_probes, probe_rates, score_drift, score_overwrite

SEEDS = range(8)


def _swap(text: str, a: str, b: str) -> str:
    """Every whole-word ``a`` becomes ``b`` and vice versa."""
    return re.sub(rf"\b({re.escape(a)}|{re.escape(b)})\b", lambda m: b if m[1] == a else a, text)


def _flip_negation(item: dict) -> str:
    predicate = item["predicate"]
    if item["negated"]:
        return item["context"].replace(f"was not {predicate}", f"was {predicate}")
    return item["context"].replace(f"was {predicate}", f"was not {predicate}")


@pytest.mark.parametrize("kind", ["overwrite", "drift"])
def test_same_seed_same_items_other_seed_other_items(kind):
    items = make_probes(kind, 12, seed=3)
    assert items == make_probes(kind, 12, seed=3)
    assert json.loads(json.dumps(items)) == items  # plain JSON-serialisable dicts
    other = make_probes(kind, 12, seed=4)
    assert [i["context"] for i in items] != [i["context"] for i in other]
    assert len({i["probe_id"] for i in items + other}) == 24


def test_overwrite_items_cover_distinct_subjects():
    items = make_probes("overwrite", 35, seed=0)
    assert len({i["subject"] for i in items}) == 35
    assert {i["kind"] for i in items} == {"overwrite"}


@pytest.mark.parametrize("seed", SEEDS)
def test_overwrite_context_states_the_counterfactual_and_not_the_prior(seed):
    for item in make_probes("overwrite", 40, seed=seed):
        context, fact, prior = item["context"], item["fact"], item["prior"]
        assert fact != prior
        assert re.search(rf"\b{item['subject']}\b[^.]*\b{fact}\.", context), context
        assert not re.search(rf"\b{prior}\b", context, re.IGNORECASE), context
        assert score_overwrite(item, context) == "kept"
        assert score_overwrite(item, context.upper()) == "kept"  # case-insensitive
        overwritten = re.sub(rf"\b{fact}\b", prior, context)
        assert score_overwrite(item, overwritten) == "overwritten"
        assert score_overwrite(item, "") == "lost"
        assert score_overwrite(item, f"The {item['subject']} are something else.") == "lost"


@pytest.mark.parametrize("seed", SEEDS)
def test_drift_contexts_hold_their_spans_and_score_kept(seed):
    items = make_probes("drift", 30, seed=seed)
    assert [i["kind"] for i in items[:3]] == ["role", "negation", "order"]
    for item in items:
        context = item["context"]
        if item["kind"] == "role":
            assert f"{item['agent']} {item['verb']} {item['patient']}" in context
        elif item["kind"] == "negation":
            assert (f"was not {item['predicate']}" in context) == item["negated"]
        else:
            assert context.index(item["first"]) < context.index(item["second"])
        assert score_drift(item, context) == "kept", item
        assert score_drift(item, "") == "lost"


@pytest.mark.parametrize("seed", SEEDS)
def test_swaps_and_flipped_polarity_score_drifted(seed):
    for item in make_probes("drift", 30, seed=seed):
        if item["kind"] == "role":
            drifted = _swap(item["context"], item["agent"], item["patient"])
        elif item["kind"] == "negation":
            drifted = _flip_negation(item)
        else:
            drifted = _swap(item["context"], item["first"], item["second"])
        assert drifted != item["context"]
        assert score_drift(item, drifted) == "drifted", (item, drifted)


def test_drift_scorer_reads_passive_contractions_and_after():
    role = {"kind": "role", "agent": "Alice", "patient": "Bob", "verb": "thanked"}
    assert score_drift(role, "It was late. Bob was thanked by Alice.") == "kept"
    assert score_drift(role, "Alice was thanked by Bob.") == "drifted"
    assert score_drift(role, "Alice and Bob left.") == "lost"  # no verb
    negation = {"kind": "negation", "subject": "door", "predicate": "locked", "negated": True}
    assert score_drift(negation, "The door wasn't locked.") == "kept"
    assert score_drift(negation, "The door was never locked.") == "kept"
    assert score_drift(negation, "The door was locked, not open.") == "drifted"  # after it
    assert score_drift(negation, "The door was unlocked.") == "kept"  # the negative form
    assert score_drift(negation, "The door was painted.") == "lost"  # another word
    order = {"kind": "order", "first": "cat", "second": "plants"}
    assert score_drift(order, "She watered the plants after she fed the cat.") == "kept"
    assert score_drift(order, "She watered the plants before she fed the cat.") == "drifted"
    assert score_drift(order, "She fed the cat.") == "lost"


def test_overwrite_scorer_looks_near_the_subject():
    item = {"kind": "overwrite", "subject": "strawberries", "fact": "white", "prior": "red"}
    # the subject's own sentence decides, whatever other sentences say
    assert score_overwrite(item, "The strawberries are red. Her hat is white.") == "overwritten"
    assert score_overwrite(item, "The strawberries are WHITE, not red.") == "kept"
    assert score_overwrite(item, "The berries are white.") == "kept"  # subject renamed: whole text
    assert score_overwrite(item, "The strawberries are reddish.") == "lost"  # whole words only


def test_probe_rates_by_kind():
    overwrite = make_probes("overwrite", 4, seed=0)
    texts = [
        overwrite[0]["context"],
        overwrite[1]["context"],
        re.sub(rf"\b{overwrite[2]['fact']}\b", overwrite[2]["prior"], overwrite[2]["context"]),
        "",
    ]
    drift = make_probes("drift", 3, seed=0)  # role, negation, order
    texts += [
        _swap(drift[0]["context"], drift[0]["agent"], drift[0]["patient"]),
        drift[1]["context"],
        "",
    ]
    rates = probe_rates(overwrite + drift, texts)
    # overwrite: 2 kept, 1 overwritten, 1 lost of 4; one item of each drift kind
    assert rates == {
        "overwrite/kept": 0.5,
        "overwrite/overwritten": 0.25,
        "overwrite/lost": 0.25,
        "role/kept": 0.0,
        "role/drifted": 1.0,
        "role/lost": 0.0,
        "negation/kept": 1.0,
        "negation/drifted": 0.0,
        "negation/lost": 0.0,
        "order/kept": 0.0,
        "order/drifted": 0.0,
        "order/lost": 1.0,
    }
    with pytest.raises(ValueError, match="4 probe items but 3 reconstructions"):
        probe_rates(overwrite, texts[:3])


@pytest.mark.parametrize(
    ("kind", "n", "message"),
    [
        ("overwrite", 0, "n must be an int >= 1"),
        ("drift", -2, "n must be an int >= 1"),
        ("drift", 2.5, "n must be an int >= 1"),
        ("paraphrase", 3, "unknown probe kind 'paraphrase': use 'overwrite' or 'drift'"),
    ],
)
def test_bad_arguments_raise_value_error(kind, n, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_probes(kind, n, seed=0)
