"""Seeded faithfulness probes for compressor-decoder reconstructions (the size-fidelity paradox,
arXiv 2602.09789): generators of short contexts and scorers of what a reconstruction kept.

- overwrite: a counterfactual fact among filler sentences ("The strawberries in Mira's garden
  are white."); the reconstruction keeps it, overwrites it with the prior ("red"), or loses it.
- drift: a role binding ("Alice thanked Bob"), a polarity ("The door was not locked") or an
  event order ("First ..., then ..."); the reconstruction keeps it, drifts (roles swapped,
  negation dropped or added, events swapped), or loses it.

Scorers match whole words, case-insensitively, on the surface text; they are deliberately
simple, so a paraphrase that renames the subject, verb or event nouns scores "lost".
Items are plain JSON-serialisable dicts.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

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

_NEGATION = re.compile(r"\b(?:not|never|no)\b|n['’]t\b", re.IGNORECASE)


def _has(text: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word)}\b", text, re.IGNORECASE) is not None


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


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


def score_overwrite(item: dict[str, Any], reconstruction: str) -> Outcome:
    """Returns "kept" when the counterfactual value is in a sentence that names the subject,
    "overwritten" when the prior is there instead, "lost" when neither is. A reconstruction
    that no longer names the subject is searched whole."""
    scoped = [s for s in _sentences(reconstruction) if _has(s, item["subject"])]
    text = " ".join(scoped) if scoped else reconstruction
    if _has(text, item["fact"]):
        return "kept"
    return "overwritten" if _has(text, item["prior"]) else "lost"


def _role(item: dict[str, Any], sentence: str) -> Outcome | None:
    match = re.search(rf"\b{re.escape(item['verb'])}\b", sentence, re.IGNORECASE)
    if match is None:
        return None
    before, after = sentence[: match.start()], sentence[match.end() :]
    if re.match(r"\s*by\b", after, re.IGNORECASE):  # passive: "Bob was thanked by Alice"
        before, after = after, before
    if _has(before, item["agent"]) and _has(after, item["patient"]):
        return "kept"
    if _has(before, item["patient"]) and _has(after, item["agent"]):
        return "drifted"
    return None


def _negation(item: dict[str, Any], sentence: str) -> Outcome | None:
    match = re.search(rf"\b{re.escape(item['predicate'])}\b", sentence, re.IGNORECASE)
    if match is None:
        return None
    head = sentence[: match.start()]
    subject = re.search(rf"\b{re.escape(item['subject'])}\b", head, re.IGNORECASE)
    clause = head[subject.end() :] if subject else head  # from the subject to the predicate
    negated = _NEGATION.search(clause) is not None
    return "kept" if negated == item["negated"] else "drifted"


def _order(item: dict[str, Any], text: str) -> Outcome:
    first = re.search(rf"\b{re.escape(item['first'])}\b", text, re.IGNORECASE)
    second = re.search(rf"\b{re.escape(item['second'])}\b", text, re.IGNORECASE)
    if first is None or second is None:
        return "lost"
    start, end = sorted((first.start(), second.start()))
    mentioned_in_order = first.start() < second.start()
    # "... watered the plants after she fed the cat": the event mentioned first came second
    if _has(text[start:end], "after"):
        mentioned_in_order = not mentioned_in_order
    return "kept" if mentioned_in_order else "drifted"


def score_drift(item: dict[str, Any], reconstruction: str) -> Outcome:
    """Returns "kept", "drifted" (roles swapped, polarity flipped, events swapped) or "lost"
    (the probed words are not found). Roles and polarity are read in the first sentence holding the
    verb / predicate that decides; order over the whole text, by first mention, with "after"
    between the two events reversing it."""
    if item["kind"] == "order":
        return _order(item, reconstruction)
    read = _role if item["kind"] == "role" else _negation
    for sentence in _sentences(reconstruction):
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
