"""The warm start of a judge whose mistakes vary between samples (``judge_style: varied``), for
the ConsistRM preset ``cpu-varied`` (``scripts/repro/consistrm.py``; rule in docs/grm.md).

The ``cpu`` preset's warm judge failed its pre-check twice: its errors were the same from sample
to sample, so the majority of its own votes never beat its greedy verdict and the label-free
reward had nothing to teach. This judge is taught a distribution instead of one target per row.
Every (pair, order) prompt appears ``lazy_copies + len(FORMS)`` times in the SFT data:

- ``lazy_copies`` times with the *lazy* judgment, a first-position heuristic that checks
  nothing: ``<Analysis>At a glance, Response 1 is right.</Analysis><Result>Response 1 is better
  than Response 2</Result>`` (right on half the rows: the positions are balanced);
- once with each of the checked analyses in :data:`FORMS`, four wordings that each list both
  values, compute the right one and name the response that states it.

With 2 lazy copies and 4 forms, one judgment in three is lazy, and the checked ones are spread
over four first tokens at about 1/6 each. Greedy decoding then follows the single most likely
opening, the lazy one, and says "Response 1" whatever the pair; a sample is lazy only about a
third of the time, and its lazy mistakes fall on different samples. That is the condition under
which a majority of samples can beat greedy: the right verdict is reached along several paths,
the wrong one along one. Whether the fine-tuned judge actually has it is what the pre-check
(the registered gate) measures.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from lit_rlhf.data.judge_templates import render_judge_prompt
from repro.judge_common import TEMPLATE, ArithPair, judgment

LAZY = "At a glance, Response 1 is right."

Form = Callable[[str, int, int, int, int], str]  # (expr, v1, v2, right value, k) -> analysis

FORMS: tuple[Form, ...] = (
    lambda e, v1, v2, c, k: (
        f"Response 1 says {v1}. Response 2 says {v2}. {e} = {c}, as Response {k} says."
    ),
    lambda e, v1, v2, c, k: (
        f"{e} = {c}. Response 1 says {v1} and Response 2 says {v2}, so Response {k} is right."
    ),
    lambda e, v1, v2, c, k: (
        f"Checking: Response 1 gives {v1}, Response 2 gives {v2}, and {e} "
        f"is {c}. Response {k} is right."
    ),
    lambda e, v1, v2, c, k: (
        f"Values: {v1} and {v2}. The right one is {e} = {c}, from Response {k}."
    ),
)


def _result(first: bool) -> str:
    return "Response 1 is better than Response 2" if first else (
        "Response 2 is better than Response 1")  # fmt: skip


def lazy_judgment() -> str:
    """The heuristic judgment: says response 1 without checking anything."""
    return f"<Analysis>{LAZY}</Analysis><Result>{_result(True)}</Result>"


def checked_judgment(pair: ArithPair, form: int, *, swapped: bool = False) -> str:
    """The checked judgment of the pair as shown (``swapped``: response 2 first) in wording
    ``form`` of :data:`FORMS`; its verdict names the response stating the right value."""
    v1, v2 = pair.values[::-1] if swapped else pair.values
    k = 1 if v1 == pair.right else 2
    text = FORMS[form](pair.expr, v1, v2, pair.right, k)
    return f"<Analysis>{text}</Analysis><Result>{_result(k == 1)}</Result>"


def varied_rows(pairs: Sequence[ArithPair], *, lazy_copies: int, seed: int) -> list[dict[str, str]]:
    """SFT rows (``{"prompt", "response"}``): every pair in both orders, ``lazy_copies`` times
    with the lazy judgment and once in each checked wording; shuffled by ``seed``."""
    if lazy_copies < 1:
        raise ValueError(
            f"lazy_copies must be >= 1 (got {lazy_copies}): without the lazy judgment this is "
            "the cpu preset's judge. Fix: use judge_style: checked."
        )
    rows: list[dict[str, str]] = []
    for pair in pairs:
        r1, r2 = (f"{pair.expr} = {v}" for v in pair.values)
        for swapped in (False, True):
            a, b = (r2, r1) if swapped else (r1, r2)
            prompt = render_judge_prompt(TEMPLATE, prompt=f"What is {pair.expr}?",
                                         response_1=a, response_2=b)  # fmt: skip
            targets = [lazy_judgment()] * lazy_copies + [
                checked_judgment(pair, f, swapped=swapped) for f in range(len(FORMS))
            ]
            rows.extend({"prompt": prompt, "response": t} for t in targets)
    random.Random(f"varied-warm-start/{seed}").shuffle(rows)
    return rows


def fact_rows(max_value: int, copies: int) -> list[dict[str, str]]:
    """``copies`` SFT rows of every question of the pools' space (``What is a op b?`` ->
    ``a op b = c``, operands 1..``max_value``): the arithmetic a judge trained from random
    weights (the GPU window) must know before it can check pairs it never saw."""
    space = [(a, op, b) for a in range(1, max_value + 1) for b in range(1, max_value + 1)
             for op in "+-"]  # fmt: skip
    rows: list[dict[str, str]] = []
    for a, op, b in space:
        right = a + b if op == "+" else a - b
        rows += [
            {"prompt": f"What is {a} {op} {b}?", "response": f"{a} {op} {b} = {right}"}
        ] * copies
    random.Random("facts").shuffle(rows)
    return rows


def format_probe(pair: ArithPair) -> str:
    """Every target wording of one pair (what the warm judge's cache key covers)."""
    forms = [checked_judgment(pair, f) for f in range(len(FORMS))]
    return lazy_judgment() + "".join(forms) + judgment(pair)
