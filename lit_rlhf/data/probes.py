"""Seeded faithfulness probes for compressor-decoder reconstructions (the size-fidelity paradox,
arXiv 2602.09789): generators of short contexts and scorers of what a reconstruction kept.

- overwrite: a counterfactual fact among filler sentences ("The strawberries in Mira's garden
  are white."); the reconstruction keeps it, overwrites it with the prior ("red"), or loses it.
- drift: a role binding ("Alice thanked Bob"), a polarity ("The door was not locked") or an
  event order ("First ..., then ..."); the reconstruction keeps it, drifts (roles swapped,
  negation dropped or added, events swapped), or loses it.

Scorers judge meaning with deterministic rules (:mod:`lit_rlhf.data.probe_reading`): a value
negated or contrasted away ("red, not white", "white rather than red") is not kept, the order
of events is read from the connectives, not from the order of the clauses ("Before watering the
plants, Mira fed the cat"), roles from active, passive and cleft sentences, polarity from
negators, negative forms ("unlocked") and listed antonyms. They still find the probed words by
whole-word matching, so a paraphrase that renames the subject, verb or event nouns scores
"lost"; the rules' known limits are in docs/compressor.md. Items are plain JSON-serialisable
dicts.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from lit_rlhf.data.probe_reading import (
    event_order,
    find_word,
    is_negated,
    polarity,
    read_roles,
    sentences,
)

ProbeKind = Literal["overwrite", "drift"]
Outcome = Literal["kept", "overwritten", "drifted", "lost"]

# subject (with the owner) | subject word | verb | prior | counterfactual alternatives
_FACTS = """\
strawberries in {name}'s garden|strawberries|are|red|white,blue,black
bananas at {name}'s market stall|bananas|are|yellow|purple,blue,red
grass behind {name}'s house|grass|is|green|orange,purple,silver
sky over {name}'s village|sky|is|blue|green,orange,pink
snow on {name}'s roof|snow|is|white|black,red,green
crows near {name}'s barn|crows|are|black|white,yellow,orange
milk from {name}'s farm|milk|is|white|blue,green,pink
carrots in {name}'s field|carrots|are|orange|blue,white,black
lemons on {name}'s tree|lemons|are|sour|sweet,salty,bland
coal in {name}'s cellar|coal|is|black|white,pink,yellow
ice on {name}'s pond|ice|is|cold|warm,hot
honey from {name}'s hives|honey|is|sweet|bitter,salty,sour
elephants at {name}'s sanctuary|elephants|are|large|tiny,small
mice in {name}'s attic|mice|are|small|huge,enormous,giant
tomatoes in {name}'s greenhouse|tomatoes|are|red|blue,white,silver
pumpkins on {name}'s porch|pumpkins|are|orange|blue,white,black
swans on {name}'s lake|swans|are|white|green,orange,purple
limes in {name}'s kitchen|limes|are|green|red,blue,white
sugar in {name}'s pantry|sugar|is|sweet|salty,bitter,sour
feathers in {name}'s pillow|feathers|are|light|heavy
cheetahs at {name}'s reserve|cheetahs|are|fast|slow,sluggish
snails in {name}'s yard|snails|are|slow|fast,quick,swift
peppers from {name}'s farm|peppers|are|spicy|mild,bland
fire in {name}'s fireplace|fire|is|hot|cold,icy,freezing
ocean near {name}'s town|ocean|is|salty|sweet,sugary
diamonds in {name}'s ring|diamonds|are|hard|soft,squishy
pillows on {name}'s bed|pillows|are|soft|hard,rigid,stiff
desert near {name}'s camp|desert|is|dry|wet,soggy,humid
roses in {name}'s vase|roses|are|red|green,blue,black
flamingos at {name}'s zoo|flamingos|are|pink|blue,green,black
sunflowers in {name}'s meadow|sunflowers|are|yellow|blue,black,white
cucumbers in {name}'s salad|cucumbers|are|green|red,purple,yellow
clouds over {name}'s farm|clouds|are|white|green,red,purple
coffee in {name}'s mug|coffee|is|bitter|sweet,salty
eggplants in {name}'s basket|eggplants|are|purple|orange,blue,red"""

# fmt: off
_NAMES = (
    "Mira", "Tomas", "Priya", "Kenji", "Lena", "Omar", "Sofia", "Dmitri", "Amara", "Felix",
    "Ingrid", "Rafael", "Yuki", "Hana", "Jonas", "Nadia", "Elias", "Zara", "Marco", "Leila",
    "Oscar", "Greta", "Alice", "Bob",
)
_FILLERS = (
    "{name} walked to the station early that morning.",
    "It had rained for most of the week.",
    "{name} kept a notebook of small observations.",
    "A neighbour stopped by to talk about the weekend.",
    "The radio played quietly in the background.",
    "{name} planned to write a letter about it later.",
    "Nobody in the family found this surprising.",
    "The afternoon passed slowly.",
    "{name} had lived in the area for years.",
    "A few visitors asked questions about the place.",
    "Later that evening the streets were quiet.",
    "{name} mentioned it to a friend on the phone.",
)
_VERBS = (
    "thanked", "hugged", "called", "praised", "pushed", "followed", "blamed", "visited", "paid",
    "warned", "greeted", "helped", "interviewed", "hired", "taught", "chased", "invited",
    "forgave", "rescued", "ignored",
)
_TAILS = ("after the meeting", "at the station", "during lunch", "on Tuesday", "in the hallway")
# (subject, predicate that the sentence affirms or negates)
_POLARITY = (
    ("door", "locked"), ("window", "open"), ("meeting", "cancelled"), ("bridge", "closed"),
    ("oven", "hot"), ("letter", "signed"), ("car", "damaged"), ("report", "finished"),
    ("train", "late"), ("shop", "busy"), ("package", "delivered"), ("museum", "crowded"),
    ("road", "flooded"), ("ticket", "valid"), ("lamp", "broken"), ("dog", "hungry"),
    ("contract", "approved"), ("garden", "watered"),
)
_WHEN = ("arrived", "checked", "came back", "looked again")
# (event phrase, the noun that identifies it in a reconstruction)
_EVENTS = (
    ("fed the cat", "cat"), ("watered the plants", "plants"), ("read the newspaper", "newspaper"),
    ("washed the dishes", "dishes"), ("called the bank", "bank"), ("locked the gate", "gate"),
    ("packed a suitcase", "suitcase"), ("ironed a shirt", "shirt"), ("baked some bread", "bread"),
    ("cleaned the windows", "windows"), ("mailed the parcel", "parcel"), ("paid the rent", "rent"),
    ("repaired the bicycle", "bicycle"), ("swept the porch", "porch"), ("booked a taxi", "taxi"),
)
# fmt: on

# the forms a reconstruction may use for each verb of the role items (past first)
_VERB_FORMS = {
    line.split()[0]: tuple(line.split())
    for line in """\
thanked thank thanks thanking
hugged hug hugs hugging
called call calls calling
praised praise praises praising
pushed push pushes pushing
followed follow follows following
blamed blame blames blaming
visited visit visits visiting
paid pay pays paying
warned warn warns warning
greeted greet greets greeting
helped help helps helping
interviewed interview interviews interviewing
hired hire hires hiring
taught teach teaches teaching
chased chase chases chasing
invited invite invites inviting
forgave forgive forgives forgiving forgiven
rescued rescue rescues rescuing
ignored ignore ignores ignoring""".splitlines()
}
# words that state the opposite of a polarity predicate (a negative form "un-"/"in-"/"non-" is
# recognised without a list)
_ANTONYMS = {
    "open": ["closed", "shut"],
    "closed": ["open"],
    "hot": ["cold"],
    "late": ["early", "punctual"],
    "busy": ["quiet", "empty"],
    "crowded": ["empty", "deserted"],
    "valid": ["expired"],
    "broken": ["intact"],
}
_PRONOUN_START = re.compile(r"\s*(?:they|it|these|those)\b", re.IGNORECASE)


def _has(text: str, word: str) -> bool:
    return find_word(text, word) is not None


def _embed(rng: random.Random, sentence: str, name: str, avoid: Sequence[str]) -> str:
    """The sentence among one or two filler sentences on each side, none containing a word
    of ``avoid`` (so the scorers only ever see the probed words in the probed sentence)."""
    pool = [f.format(name=name) for f in _FILLERS]
    pool = [f for f in pool if not any(_has(f, w) for w in avoid)]
    before, after = rng.randint(1, 2), rng.randint(1, 2)
    chosen = rng.sample(pool, before + after)
    return " ".join([*chosen[:before], sentence, *chosen[before:]])


def _overwrite_item(rng: random.Random, row: str, probe_id: str) -> dict[str, Any]:
    where, subject, verb, prior, alternatives = row.split("|")
    name, fact = rng.choice(_NAMES), rng.choice(alternatives.split(","))
    sentence = f"The {where.format(name=name)} {verb} {fact}."
    context = _embed(rng, sentence, name, avoid=[subject, prior, fact])
    return {
        "probe_id": probe_id,
        "kind": "overwrite",
        "context": context,
        "subject": subject,
        "fact": fact,
        "prior": prior,
    }


def _drift_item(rng: random.Random, kind: str, probe_id: str) -> dict[str, Any]:
    name, other, narrator = rng.sample(_NAMES, 3)  # the narrator appears in the fillers only
    item: dict[str, Any] = {"probe_id": probe_id, "kind": kind}
    if kind == "role":
        verb = rng.choice(_VERBS)
        sentence = f"{name} {verb} {other} {rng.choice(_TAILS)}."
        item |= {"agent": name, "patient": other, "verb": verb}
        avoid = [name, other, verb]
    elif kind == "negation":
        subject, predicate = rng.choice(_POLARITY)
        negated = rng.random() < 0.5
        polarity = "not " if negated else ""
        sentence = f"The {subject} was {polarity}{predicate} when {name} {rng.choice(_WHEN)}."
        item |= {"subject": subject, "predicate": predicate, "negated": negated}
        avoid = [subject, predicate, "not", "no", "never"]
    else:
        (first, first_key), (second, second_key) = rng.sample(_EVENTS, 2)
        sentence = f"{name} first {first} and then {second}."
        item |= {"first": first_key, "second": second_key}
        avoid = [first_key, second_key, "after", "before"]
    return {**item, "context": _embed(rng, sentence, narrator, avoid)}


def make_probes(kind: ProbeKind, n: int, *, seed: int) -> list[dict[str, Any]]:
    """``n`` probe items of ``kind``, deterministically from ``seed``.

    overwrite items: ``probe_id, kind="overwrite", context, subject, fact, prior``; the table's
    subjects are shuffled and cycled, so up to 35 items have distinct subjects.
    drift items: ``probe_id, kind, context`` plus, by kind (cycling role, negation, order):
    role ``agent, patient, verb``; negation ``subject, predicate, negated``; order ``first,
    second`` (the nouns that identify the two events, in the order they happened).
    """
    if kind not in ("overwrite", "drift"):
        raise ValueError(f"unknown probe kind {kind!r}: use 'overwrite' or 'drift'")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (the number of probe items), got {n!r}")
    rng = random.Random(seed)
    if kind == "overwrite":
        rows = _FACTS.splitlines()
        rng.shuffle(rows)
        return [
            _overwrite_item(rng, rows[i % len(rows)], f"overwrite-{seed}-{i}") for i in range(n)
        ]
    kinds = ("role", "negation", "order")
    return [_drift_item(rng, kinds[i % 3], f"{kinds[i % 3]}-{seed}-{i}") for i in range(n)]


def _subject_scope(text: str, subject: str) -> str:
    """The sentences that name ``subject``, each with the sentences right after it that open
    with a pronoun ("They are white."); the whole text when none names it."""
    scoped: list[str] = []
    follows = False
    for sentence in sentences(text):
        if find_word(sentence, subject) is not None:
            scoped.append(sentence)
            follows = True
        elif follows and _PRONOUN_START.match(sentence):
            scoped.append(sentence)
        else:
            follows = False
    return " ".join(scoped) if scoped else text


def score_overwrite(item: dict[str, Any], reconstruction: str) -> Outcome:
    """Returns "kept" when the reconstruction asserts the counterfactual value of the subject,
    "overwritten" when it asserts the prior instead or denies the counterfactual value, "lost"
    when it does neither.

    Read in the sentences naming the subject (and the pronoun sentences after them; the whole
    text if none names it), by meaning: a value negated or contrasted away is not asserted
    (:func:`~lit_rlhf.data.probe_reading.polarity`), so "The strawberries are red, not white"
    is overwritten and "not red but white" is kept."""
    text = _subject_scope(reconstruction, item["subject"])
    fact = polarity(text, item["fact"])
    if fact == "asserted":
        return "kept"
    if fact == "denied" or polarity(text, item["prior"]) == "asserted":
        return "overwritten"
    return "lost"


def _verb(sentence: str, verb: str) -> re.Match[str] | None:
    forms = _VERB_FORMS.get(verb.lower(), (verb,))
    pattern = r"\b(?:" + "|".join(re.escape(f) for f in forms) + r")\b"
    return re.search(pattern, sentence, re.IGNORECASE)


def _role(item: dict[str, Any], sentence: str) -> Outcome | None:
    """kept: the same agent and patient, asserted; drifted: a role swapped or the action
    negated ("Alice did not thank Bob"); None: this sentence does not decide."""
    match = _verb(sentence, item["verb"])
    if match is None:
        return None
    agent, patient = read_roles(sentence, match, (item["agent"], item["patient"]))
    if agent is None and patient is None:
        return None
    if agent == item["patient"] or patient == item["agent"] or is_negated(sentence, match.start()):
        return "drifted"
    return "kept" if (agent, patient) == (item["agent"], item["patient"]) else None


def _negation(item: dict[str, Any], sentence: str) -> Outcome | None:
    """The predicate's polarity in the first place the sentence states it: the predicate
    itself, its negative form ("unlocked", "invalid") or a listed antonym ("open" ->
    "closed"), each under the clause's negators."""
    predicate = item["predicate"].lower()
    negative = [f"un{predicate}", f"in{predicate}", f"non-{predicate}", f"non{predicate}"]
    negative += _ANTONYMS.get(predicate, [])
    forms = [(predicate, False), *((word, True) for word in negative)]
    hits = [(m.start(), flips) for word, flips in forms if (m := find_word(sentence, word))]
    if not hits:
        return None
    position, flips = min(hits)
    negated = is_negated(sentence, position) ^ flips
    return "kept" if negated == item["negated"] else "drifted"


def _order(item: dict[str, Any], text: str) -> Outcome:
    """kept when the two events are told in the order they happened (whatever the order of the
    clauses), drifted when reversed or when either event is negated, lost when one is not
    named."""
    order = event_order(text, item["first"], item["second"])
    if order == "lost":
        return "lost"
    for key in (item["first"], item["second"]):
        match = find_word(text, key)
        if match is not None and is_negated(text, match.start()):
            return "drifted"
    return "kept" if order == "in_order" else "drifted"


def score_drift(item: dict[str, Any], reconstruction: str) -> Outcome:
    """Returns "kept", "drifted" (roles swapped, action or event negated, polarity flipped,
    events reordered) or "lost" (the probed words are not found), judged by meaning with the
    rules of :mod:`lit_rlhf.data.probe_reading`. Roles are read in the first sentence holding
    the verb (any of its forms) that decides; polarity in the first sentence stating the
    predicate, those naming the subject first; order over the whole text."""
    if item["kind"] == "order":
        return _order(item, reconstruction)
    parts = sentences(reconstruction)
    if item["kind"] == "negation":
        named = [s for s in parts if find_word(s, item["subject"]) is not None]
        parts = named + [s for s in parts if s not in named]
    read = _role if item["kind"] == "role" else _negation
    for sentence in parts:
        outcome = read(item, sentence)
        if outcome is not None:
            return outcome
    return "lost"


def score_probe(item: dict[str, Any], reconstruction: str) -> Outcome:
    """``score_overwrite`` or ``score_drift``, by the item's kind."""
    if item["kind"] == "overwrite":
        return score_overwrite(item, reconstruction)
    return score_drift(item, reconstruction)


def probe_rates(
    items: Sequence[dict[str, Any]], reconstructions: Sequence[str]
) -> dict[str, float]:
    """Fraction of each outcome per item kind, keyed ``"{kind}/{outcome}"``: for overwrite items
    kept / overwritten / lost, for role, negation and order items kept / drifted / lost (each
    kind's fractions sum to 1; kinds absent from ``items`` are left out)."""
    if len(items) != len(reconstructions):
        raise ValueError(f"{len(items)} probe items but {len(reconstructions)} reconstructions")
    counts: Counter[tuple[str, str]] = Counter(
        (item["kind"], score_probe(item, text))
        for item, text in zip(items, reconstructions, strict=True)
    )
    totals = Counter(item["kind"] for item in items)
    rates = {}
    for kind, total in totals.items():
        second = "overwritten" if kind == "overwrite" else "drifted"
        for outcome in ("kept", second, "lost"):
            rates[f"{kind}/{outcome}"] = counts[(kind, outcome)] / total
    return rates
