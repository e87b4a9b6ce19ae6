"""Write ``lit_rlhf/data/samples/text_sample.jsonl``: short encyclopedic documents about invented
people, places, objects and events, one ``{"text": ...}`` per line, for compressor-decoder tests
and CPU runs (``TextChunks``).

Everything is generated here from templates and seeded word tables (names are built from
syllables), so the text is the project's own and the same seed always writes the same file. The
documents carry what the reconstruction probes look for (METHODS.md section 5): plain facts,
unusual attribute pairs a model's prior would "correct" (a blue lemon), negations, who did what
to whom, and the order of events.

    python scripts/data/make_text_sample.py [--out PATH] [--docs 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "lit_rlhf" / "data" / "samples" / "text_sample.jsonl"

SYLLABLES = "ka lo mer tis van del ro shi na bel tor qui sa fen dor ri mal zo ul ve len kor ith pa"
PROFESSIONS = "baker, weaver, astronomer, clockmaker, sailor, painter, miller, teacher, map maker"
PROFESSIONS += ", glassblower, beekeeper, judge, carpenter, singer"
SKILLS = "swim, read music, ride a horse, cook, speak the northern dialect, play chess, sew"
COLORS = "red, blue, green, yellow, white, black, grey, orange, purple, silver, brown, pink"
THINGS = "lemon, strawberry, rose, river, roof, bridge, boat, lantern, apple, cat, horse, tower"
MATERIALS = "oak, iron, glass, copper, stone, silver, clay, bone, brass, pine"
OBJECTS = "clock, lamp, bell, chair, mirror, drum, compass, teapot, chest, flute"
PLACE_TYPES = "village, town, port, city, valley, island"
BUILDINGS = "library, bridge, harbour, school, market, hall, tower, mill, theatre, well"
GOODS = "salt, wool, honey, timber, fish, glass, cheese, rope, paper, tea"
FOODS = "fish, cheese, honey, eggs, beans, pork, mushrooms, onions, plums, bread"
EVENTS = "flood, fair, race, storm, election, wedding, strike, fire"
MONTHS = "January February March April May June July August September October November December"
DIRECTIONS = "north, south, east, west"
SEASONS = "spring, summer, autumn, winter"
ANIMALS = "goat, dog, cat, horse, sheep, donkey"
PARTS = "lid, base, handle, side"
KEEPERS = "library, town hall, museum, school, castle, abbey"
BROKEN = "spring, key, wheel, string, pin"


class Writer:
    """Draws names and words from one seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, table: str, avoid: str = "") -> str:
        """One entry of a comma-separated table, other than ``avoid``."""
        return self.rng.choice([w for w in table.split(", ") if w != avoid])

    def name(self, syllables: int = 2) -> str:
        return "".join(self.rng.choices(SYLLABLES.split(), k=syllables)).capitalize()

    def person(self) -> str:
        return f"{self.name(2)} {self.name(self.rng.randint(2, 3))}"

    def a(self, table: str, avoid: str = "") -> str:
        """An entry with its indefinite article ("an apple", "a roof")."""
        word = self.pick(table, avoid)
        return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"

    def year(self) -> int:
        return self.rng.randint(1400, 1950)

    def num(self, low: int = 2, high: int = 40) -> int:
        return self.rng.randint(low, high)


def plural(word: str) -> str:
    if word in ("sheep", "fish"):
        return word
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + ("es" if word.endswith(("s", "ch", "sh", "x")) else "s")


def person_doc(w: Writer) -> list[str]:
    name, place, other = w.person(), w.name(3), w.person()
    she, her = w.rng.choice([("she", "her"), ("he", "his")])
    job, born = w.pick(PROFESSIONS), w.year()
    c1 = w.pick(COLORS)
    return [
        f"{name} was a {job} from {place}.",
        f"{she.capitalize()} was born in {born} and lived in {w.name(3)} for {w.num()} years.",
        f"{name} never learned to {w.pick(SKILLS)}.",
        f"Before {she} became a {job}, {she} worked as {w.a(PROFESSIONS, job)}.",
        f"In {born + w.num(15, 50)}, {she} built {w.a(MATERIALS)} {w.pick(OBJECTS)} for "
        f"the {w.pick(BUILDINGS)} of {place}.",
        f"{name} taught {other}, who later became {w.a(PROFESSIONS)}.",
        f"{other} admired {name}, but {name} did not like {other}.",
        f"{her.capitalize()} favourite colour was {c1}, not {w.pick(COLORS, c1)}.",
        f"First {she} sold {her} {w.pick(ANIMALS)}, then {she} moved to {w.name(2)}, and "
        f"finally {she} opened a shop that sold {w.pick(GOODS)}.",
        f"{she.capitalize()} had {w.num(0, 9)} children and kept {w.num(2, 12)} "
        f"{plural(w.pick(ANIMALS))}.",
        f"People in {place} say that {name} once painted {w.a(THINGS)} {w.pick(COLORS)}.",
        f"{name} wrote a book about {plural(w.pick(THINGS))}, which was not printed until "
        f"{born + w.num(100, 200)}.",
        f"{she.capitalize()} was taller than {other} and {w.num(2, 20)} years older.",
        f"{name} died in {born + w.num(51, 90)}, {w.num(2, 30)} years after {other}.",
    ]


def place_doc(w: Writer) -> list[str]:
    place, founder, kind = w.name(3), w.person(), w.pick(PLACE_TYPES)
    c1, thing, year = w.pick(COLORS), w.pick(THINGS), w.year()
    return [
        f"{place} is a small {kind} in the {w.pick(DIRECTIONS)} of {w.name(3)}.",
        f"It lies {w.num(3, 90)} kilometres {w.pick(DIRECTIONS)} of {w.name(2)}.",
        f"In {place} every {thing} is {c1}; elsewhere {plural(thing)} are {w.pick(COLORS, c1)}.",
        f"There is no {w.pick(BUILDINGS)} in {place}.",
        f"Its main trade is {w.pick(GOODS)}, and its people do not eat {w.pick(FOODS)}.",
        f"The {kind} was founded in {year} by {founder}, and its "
        f"{w.pick(BUILDINGS)} was built {w.num()} years later.",
        f"Every {w.pick(SEASONS)} the people of {place} hold a fair of {w.pick(GOODS)}.",
        f"The people of {place} have traded {w.pick(GOODS)} with {w.name(3)} since "
        f"{year + w.num(5, 40)}.",
        f"The river {w.name(2)} flows through it from {w.pick(DIRECTIONS)} to "
        f"{w.pick(DIRECTIONS)}.",
        f"About {w.num(2, 90) * 100} people live there, fewer than in {year + w.num(10, 60)}.",
        f"{founder} was not born in {place}; {founder.split()[0]} came from {w.name(3)}.",
        f"The {w.pick(BUILDINGS)} burned in {year + w.num(61, 200)} and was never rebuilt.",
    ]


def object_doc(w: Writer) -> list[str]:
    thing, maker, buyer = w.pick(OBJECTS), w.person(), w.person()
    c1, year = w.pick(COLORS), w.year()
    return [
        f"The {w.name(2)} {thing} is a {w.pick(MATERIALS)} {thing} made in {w.name(3)} in {year}.",
        f"It weighs {w.num(1, 60)} kilograms and is {w.num(10, 200)} centimetres long.",
        f"It is {c1}, with {w.pick(COLORS, c1)} stripes on its {w.pick(PARTS)}.",
        f"It was made by {maker}, not by {w.person()}, although many people believe so.",
        f"{buyer} bought it in {year + w.num()}, and {w.person()} sold it {w.num()} years later.",
        f"Today it is kept in the {w.pick(KEEPERS)} of {w.name(3)}.",
        f"It does not work any more: its {w.pick(BROKEN)} is broken.",
        f"{maker} made only {w.num(2, 9)} such objects, and this one is the {w.pick(COLORS)} one.",
        f"First it belonged to {buyer}, then to {w.a(PROFESSIONS)}, and last to the "
        f"{w.pick(KEEPERS)}.",
        f"Its {w.pick(PARTS)} was replaced in {year + w.num(50, 300)}, but the rest is original.",
        f"Once a year it is carried to {w.name(2)} and back.",
    ]


def event_doc(w: Writer) -> list[str]:
    kind, place, year = w.pick(EVENTS), w.name(3), w.year()
    first, second, winner, loser = (w.person() for _ in range(4))
    month = w.rng.randrange(11)
    return [
        f"The {kind} of {place} took place in {year}.",
        f"It began in {MONTHS.split()[month]} and ended in {MONTHS.split()[month + 1]}.",
        f"First {first} rang the bell of the {w.pick(BUILDINGS)}, then {second} closed the "
        f"{w.pick(BUILDINGS)}.",
        f"Before the {kind}, {first} had been {w.a(PROFESSIONS)} and {second} had been "
        f"{w.a(PROFESSIONS)}.",
        f"{winner} defeated {loser} by {w.num(2, 20)} votes to {w.num(0, 1)}.",
        f"Nobody was hurt, but the {w.pick(BUILDINGS)} was damaged.",
        f"After the {kind}, {second} became mayor of {place}.",
        f"No {kind} came to {place} again until {year + w.num(5, 80)}.",
        f"{loser} did not blame {winner}; {loser.split()[0]} blamed the weather.",
        f"During the {kind} the {plural(w.pick(THINGS))} of {place} turned {w.pick(COLORS)}.",
        f"It cost the {w.pick(PLACE_TYPES)} {w.num(2, 90) * 10} sacks of {w.pick(GOODS)}.",
    ]


KINDS: Sequence[Callable[[Writer], list[str]]] = (person_doc, place_doc, object_doc, event_doc)


def make_documents(num_docs: int = 200, *, seed: int = 0) -> list[str]:
    """``num_docs`` documents of 60-200 words: the first sentence of a kind's template set, then
    a seeded subset of the others in their order, until a drawn word budget is spent."""
    rng = random.Random(seed)
    writer = Writer(rng)
    docs = []
    for index in range(num_docs):
        first, *rest = KINDS[index % len(KINDS)](writer)
        budget = rng.randint(60, 150)
        chosen = [first]
        for sentence in rng.sample(rest, len(rest)):
            if sum(len(s.split()) for s in chosen) >= budget:
                break
            chosen.append(sentence)
        order = {s: i for i, s in enumerate([first, *rest])}
        docs.append(" ".join(sorted(chosen, key=order.__getitem__)))
    return docs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)
    docs = make_documents(opts.docs, seed=opts.seed)
    opts.out.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    print(f"wrote {len(docs)} documents to {opts.out}")


if __name__ == "__main__":
    main()
