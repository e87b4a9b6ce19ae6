"""The probe scorers judge meaning where surface matching fails (issue 21; the size-fidelity
paradox, arXiv 2602.09789): negated or contrasted facts, clauses reordered with the same order
of events, role swaps (active, passive, cleft) and negation drift.

Each phenomenon is tested on seeded variants: a template (its expected outcome written by
hand) filled with seeded names, subjects, values, verbs, events and connectives. Every test
draws at least 20 variants and asserts that every one is scored as expected."""

from __future__ import annotations

import random
import re

import pytest

from lit_rlhf.data.probes import make_probes, score_drift, score_overwrite

VARIANTS = 48  # per phenomenon and seed
SEEDS = (0, 1, 2)
NAMES = ("Mira", "Tomas", "Priya", "Kenji", "Lena", "Omar", "Sofia", "Felix", "Alice", "Bob")
SHE = ("Mira", "Priya", "Lena", "Sofia", "Alice")
PRONOUN = {name: "she" if name in SHE else "he" for name in NAMES}


def _draw(rng: random.Random, templates: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """VARIANTS (template, expected) pairs, cycling through every template in a seeded order."""
    order = [templates[i % len(templates)] for i in range(VARIANTS)]
    rng.shuffle(order)
    return order


# ---------------------------------------------------------------- negated / contrasted facts
# {S}: the subject phrase, {V}: is/are, {NV}: isn't/aren't, {T}: it/they; {A} is asserted and
# {B} contrasted away. Filled with (A, B) = (fact, prior) the expected outcome is "kept"; with
# (prior, fact) it is "overwritten".
CONTRASTS = [
    "{S} {V} {A}, not {B}.",
    "{S} {V} not {B} but {A}.",
    "{S} {V} {A} rather than {B}.",
    "{S} {V} {A} instead of {B}.",
    "Instead of {B}, {S_lower} {V} {A}.",
    "{S} {V} {A} as opposed to {B}.",
    "{S} {NV} {B}; {T} {V} {A}.",
    "{S} {V} never {B}, {T} {V} {A}.",
    "{S} {V} {A} and not {B}.",
    "Unlike the usual {B} ones, {S_lower} {V} {A}.",
    "It is not true that {S_lower} {V} {B}. {S} {V} {A}.",
    "{S} {V} not only {A} but truly {A}, not {B}.",
]


def _fact_sentence(item: dict) -> dict[str, str]:
    found = re.search(rf"(The [^.]*?) (is|are) {item['fact']}\.", item["context"])
    assert found, item["context"]
    subject, verb = found[1], found[2]
    return {
        "S": subject,
        "S_lower": "t" + subject[1:],
        "V": verb,
        "NV": f"{verb}n't",
        "T": "it" if verb == "is" else "they",
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_negated_or_contrasted_facts_are_not_kept(seed):
    rng = random.Random(seed)
    items = make_probes("overwrite", VARIANTS, seed=seed)
    templates = [(t, "kept") for t in CONTRASTS] + [(t, "overwritten") for t in CONTRASTS]
    for item, (template, expected) in zip(items, _draw(rng, templates), strict=True):
        fact, prior = item["fact"], item["prior"]
        a, b = (fact, prior) if expected == "kept" else (prior, fact)
        text = template.format(A=a, B=b, **_fact_sentence(item))
        assert score_overwrite(item, text) == expected, (text, item)


DENIALS = [  # (template, expected): a denied fact is overwritten, a denied prior alone is lost
    ("{S} {V} not {F}.", "overwritten"),
    ("{S} {NV} {F}.", "overwritten"),
    ("{S} {V} never {F}.", "overwritten"),
    ("It is not the case that {S_lower} {V} {F}; {T} {V} {P}.", "overwritten"),
    ("{S} {V} not {P}.", "lost"),
    ("{S} {V} neither {P} nor plain.", "lost"),
    ("{S} {V} {F}. {T} {V} not {P}.", "kept"),
    ("{S} {NV} {P}. {T} {V} {F}.", "kept"),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_denied_facts_and_pronoun_sentences(seed):
    rng = random.Random(100 + seed)
    items = make_probes("overwrite", VARIANTS, seed=100 + seed)
    for item, (template, expected) in zip(items, _draw(rng, DENIALS), strict=True):
        parts = _fact_sentence(item)
        text = template.format(F=item["fact"], P=item["prior"], **parts)
        text = text.replace(". they", ". They").replace(". it", ". It")
        assert score_overwrite(item, text) == expected, (text, item)


def test_the_issue_examples():
    strawberry = {"kind": "overwrite", "subject": "strawberries", "fact": "white", "prior": "red"}
    text = "The strawberries in Mira's garden are red, not white."
    assert score_overwrite(strawberry, text) == "overwritten"
    order = {"kind": "order", "first": "cat", "second": "plants"}
    assert score_drift(order, "Mira fed the cat, then watered the plants.") == "kept"
    assert score_drift(order, "Before watering the plants, Mira fed the cat.") == "kept"
    assert score_drift(order, "Before feeding the cat, Mira watered the plants.") == "drifted"


# ---------------------------------------------------------------------- event order
EVENTS = (  # past, gerund, the noun the item keys on
    ("fed the cat", "feeding the cat", "cat"),
    ("watered the plants", "watering the plants", "plants"),
    ("read the newspaper", "reading the newspaper", "newspaper"),
    ("washed the dishes", "washing the dishes", "dishes"),
    ("called the bank", "calling the bank", "bank"),
    ("locked the gate", "locking the gate", "gate"),
    ("packed a suitcase", "packing a suitcase", "suitcase"),
    ("baked some bread", "baking some bread", "bread"),
    ("mailed the parcel", "mailing the parcel", "parcel"),
    ("swept the porch", "sweeping the porch", "porch"),
    ("booked a taxi", "booking a taxi", "taxi"),
    ("repaired the bicycle", "repairing the bicycle", "bicycle"),
)
# every template tells that event 1 ({p1}/{g1}) happened before event 2, in any clause order
ORDERED = [
    "{N} {p1}, then {p2}.",
    "{N} {p1} and then {p2}.",
    "{N} first {p1} and then {p2}.",
    "Before {g2}, {N} {p1}.",
    "After {g1}, {N} {p2}.",
    "{N} {p2} after {g1}.",
    "{N} {p2} after {pr} {p1}.",
    "{N} {p1} before {g2}.",
    "{N} {p1} before {pr} {p2}.",
    "{N} {p1}. After that, {pr} {p2}.",
    "{N} {p2}, but first {pr} {p1}.",
    "{N} {p2}, having {p1}.",
    "{N} {p2}. Earlier, {pr} had {p1}.",
    "{N} {p2}. Before that, {pr} {p1}.",
    "First {N} {p1}; later {pr} {p2}.",
    "{N} {p2} once {pr} had {p1}.",
    "{N} {p1}. Afterwards {pr} {p2}.",
    "{N} {p2}; {pr} had {p1} beforehand.",
    "{N} {p1} and only then {p2}.",
    "After lunch, {N} {p1}, then {p2}.",
    "Once {pr} had {p1}, {N} {p2}.",
    "{N} {p2} following {g1}.",
]
NEGATED_EVENT = [  # an event that did not happen: drifted whatever the order
    "{N} {p1}, but {pr} never {p2}.",
    "{N} {p1} and did not {b2}.",
]


def _base(past: str) -> str:
    verb, rest = past.split(" ", 1)
    base = {"fed": "feed", "read": "read", "swept": "sweep", "paid": "pay"}.get(verb)
    return f"{base or verb.removesuffix('ed')} {rest}"


@pytest.mark.parametrize("seed", SEEDS)
def test_event_order_is_judged_by_events_not_clauses(seed):
    rng = random.Random(seed)
    templates = [(t, "kept") for t in ORDERED] + [(t, "drifted") for t in ORDERED]
    templates += [(t, "drifted") for t in NEGATED_EVENT]
    for template, expected in _draw(rng, templates):
        (p1, g1, k1), (p2, g2, k2) = rng.sample(EVENTS, 2)
        name = rng.choice(NAMES)
        if expected == "drifted" and template in ORDERED:  # the same words, events swapped
            (p1, g1, k1), (p2, g2, k2) = (p2, g2, k2), (p1, g1, k1)
            first, second = k2, k1
        else:
            first, second = k1, k2
        text = template.format(N=name, pr=PRONOUN[name], p1=p1, g1=g1, p2=p2, g2=g2, b2=_base(p2))
        text = text[0].upper() + text[1:]
        item = {"kind": "order", "first": first, "second": second}
        assert score_drift(item, text) == expected, (text, item)


# ---------------------------------------------------------------------------- roles
VERBS = (  # past, base
    ("thanked", "thank"), ("praised", "praise"), ("pushed", "push"), ("blamed", "blame"),
    ("warned", "warn"), ("helped", "help"), ("taught", "teach"), ("forgave", "forgive"),
    ("invited", "invite"), ("rescued", "rescue"), ("paid", "pay"), ("hugged", "hug"),
)  # fmt: skip
TAILS = ("after the meeting", "at the station", "during lunch", "on Tuesday")
# {A} did it to {B}; filled with the item's (agent, patient) they are kept, with the two names
# swapped they are drifted
ROLE_TEMPLATES = [
    "{A} {v} {B} {t}.",
    "{B} was {v} by {A} {t}.",
    "{B} was warmly {v} by {A}.",
    "It was {B} whom {A} {v}.",
    "It was {A} who {v} {B}.",
    "{T}, {A} {v} {B}.",
    "{B}, whom {A} {v} {t}, left early.",
    "{A}, who was tired, {v} {B}.",
    "Everyone saw that {A} {v} {B}.",
    "{A} {v} {B}, and then everyone went home.",
]
ROLE_NEGATED = [  # the item's roles, but the action denied: drifted
    "{A} did not {b} {B} {t}.",
    "{A} never {v} {B}.",
    "{B} was not {v} by {A}.",
    "{A} didn't {b} {B}.",
]
ROLE_LOST = [  # no direction can be read
    "{A} and {B} {v} each other.",
    "{B} was {v} {t}.",
]


@pytest.mark.parametrize("seed", SEEDS)
def test_role_swaps_passives_and_clefts(seed):
    rng = random.Random(seed)
    templates = [(t, "kept") for t in ROLE_TEMPLATES] + [(t, "drifted") for t in ROLE_TEMPLATES]
    templates += [(t, "drifted") for t in ROLE_NEGATED] + [(t, "lost") for t in ROLE_LOST]
    for template, expected in _draw(rng, templates):
        agent, patient = rng.sample(NAMES, 2)
        verb, base = rng.choice(VERBS)
        tail = rng.choice(TAILS)
        swapped = template in ROLE_TEMPLATES and expected == "drifted"
        a, b = (patient, agent) if swapped else (agent, patient)
        text = template.format(A=a, B=b, v=verb, b=base, t=tail, T=tail.capitalize())
        item = {"kind": "role", "agent": agent, "patient": patient, "verb": verb}
        assert score_drift(item, text) == expected, (text, item)


# ------------------------------------------------------------------------- negation
POLARITY = (  # subject, predicate, the predicate's negative form or antonym
    ("door", "locked", "unlocked"), ("letter", "signed", "unsigned"),
    ("report", "finished", "unfinished"), ("package", "delivered", "undelivered"),
    ("contract", "approved", "unapproved"), ("car", "damaged", "undamaged"),
    ("ticket", "valid", "invalid"), ("window", "open", "closed"), ("oven", "hot", "cold"),
    ("museum", "crowded", "empty"), ("train", "late", "early"), ("lamp", "broken", "intact"),
)  # fmt: skip
# {P}: the predicate, {X}: its opposite. Expected outcome for an item whose context says the
# subject WAS {P} (negated=False); for an item whose context says it was NOT, the opposite.
NEGATION_TEMPLATES = [
    ("The {s} was {P}.", "kept"),
    ("The {s} was not {X}.", "kept"),
    ("When nobody was looking, the {s} was {P}.", "kept"),
    ("The {s} was {P}, not {X}.", "kept"),
    ("The {s} was {P} rather than {X}.", "kept"),
    ("The {s}, which {N} had never seen, was {P}.", "kept"),
    ("It is not true that the {s} was {X}.", "kept"),
    ("The {s} wasn't {P}.", "drifted"),
    ("The {s} was never {P}.", "drifted"),
    ("The {s} was {X}.", "drifted"),
    ("The {s} was {X} rather than {P}.", "drifted"),
    ("It is not true that the {s} was {P}.", "drifted"),
    ("The {s} was not {P} when {N} arrived.", "drifted"),
    ("Nobody denied it: the {s} was {X}.", "drifted"),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_negation_drift(seed):
    rng = random.Random(seed)
    flip = {"kept": "drifted", "drifted": "kept"}
    for template, expected in _draw(rng, NEGATION_TEMPLATES):
        subject, predicate, opposite = rng.choice(POLARITY)
        negated = rng.random() < 0.5
        text = template.format(s=subject, P=predicate, X=opposite, N=rng.choice(NAMES))
        text = text[0].upper() + text[1:]
        item = {"kind": "negation", "subject": subject, "predicate": predicate, "negated": negated}
        want = flip[expected] if negated else expected
        assert score_drift(item, text) == want, (text, item)
