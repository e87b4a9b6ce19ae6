"""Named, versioned judge-prompt templates for generative reward models.

A template turns (query, response 1, response 2) into the user message of an LLM judge. The
output format follows ConsistRM (arXiv 2604.07484): ``<Criterion>`` (the criteria for this query),
``<Analysis>`` (the comparison), then ``<Result>`` holding exactly one of :data:`RESULT_1_BETTER`
(label -1) or :data:`RESULT_2_BETTER` (label +1), the sentences ``lit_rlhf.algos.judge`` parses.
The wording is ours; the paper's own prompt is not public in what we could read [inferred].

A template's text never changes once released: a new wording gets a new name (``-v2``), so
a run's ``template`` column says exactly what the judge saw.

:func:`judge_rows` turns pairs into the rows every pair source yields (columns in
:mod:`lit_rlhf.data.pairs`), with the order-swap augmentation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

SwapMode = Literal["none", "both", "random"]
_SWAP_MODES = ("none", "both", "random")

RESULT_1_BETTER = "Response 1 is better than Response 2"
RESULT_2_BETTER = "Response 2 is better than Response 1"
RESULT_1_WORSE = "Response 1 is worse than Response 2"  # the same verdict as RESULT_2_BETTER


@dataclass(frozen=True)
class JudgeTemplate:
    """One judge instruction: ``text`` is a ``str.format`` template over ``{prompt}``,
    ``{response_1}`` and ``{response_2}`` (literal braces written ``{{ }}``); an analysis-
    preference template (``subject="Critique"``) also takes ``{critique_1}`` and
    ``{critique_2}``."""

    name: str
    description: str
    text: str
    subject: str = "Response"  # what the verdict compares: "Response" or "Critique"


# the delimited query and responses every long template ends with (or continues from)
_PAIR_BLOCK = """[Query]
{prompt}
[End of Query]

[Response 1]
{response_1}
[End of Response 1]

[Response 2]
{response_2}
[End of Response 2]"""

_CONSISTRM_V1 = (
    f"""You are an impartial judge. Compare two AI assistant responses to the query \
below and decide which one is better.
1. In <Criterion>...</Criterion>, list the criteria that matter most for this particular query \
(e.g. correctness, helpfulness, harmlessness, clarity), most important first.
2. In <Analysis>...</Analysis>, evaluate both responses against these criteria and compare them. \
Do not let the order of the responses or their length sway you.
3. In <Result>...</Result>, write exactly one of these two sentences:
{RESULT_1_BETTER}
{RESULT_2_BETTER}

"""
    + _PAIR_BLOCK
)

_CONSISTRM_V1_SHORT = f"""Which response answers the query better?
Query: {{prompt}}
Response 1: {{response_1}}
Response 2: {{response_2}}
Answer as <Criterion>...</Criterion><Analysis>...</Analysis><Result>...</Result>, the result \
being "{RESULT_1_BETTER}" or "{RESULT_2_BETTER}"."""

_VERDICT_V1 = f"""Judge which response answers the question correctly. Reply with \
<Result>{RESULT_1_BETTER}</Result> or <Result>{RESULT_2_BETTER}</Result>.

Question: What is 2 + 2?
Response 1: 2 + 2 = 4. The answer is 4.
Response 2: 2 + 2 = 5. The answer is 5.
Judgment: <Result>{RESULT_1_BETTER}</Result>

Question: What is 3 + 3?
Response 1: 3 + 3 = 7. The answer is 7.
Response 2: 3 + 3 = 6. The answer is 6.
Judgment: <Result>{RESULT_2_BETTER}</Result>

Question: {{prompt}}
Response 1: {{response_1}}
Response 2: {{response_2}}
Judgment:"""

_VERDICT_SHORT_V1 = f"""Question: {{prompt}}
Response 1: {{response_1}}
Response 2: {{response_2}}
Does Response 1 answer the question correctly? Reply <Result>{RESULT_1_BETTER}</Result> or \
<Result>{RESULT_1_WORSE}</Result>.
Judgment:"""

_REFLECTRM_V1 = (
    f"""Compare two AI assistant responses to the query below and decide which one \
is better. First analyse both in <Analysis>...</Analysis> (correctness first, then helpfulness \
and clarity; ignore their order and length), then write exactly one of these sentences in \
<Result>...</Result>:
{RESULT_1_BETTER}
{RESULT_2_BETTER}

"""
    + _PAIR_BLOCK
)

CRITIQUE_1_BETTER = "Critique 1 is better than Critique 2"
CRITIQUE_2_BETTER = "Critique 2 is better than Critique 1"

_REFLECTRM_CRITIQUE_V1 = (
    f"""Two critiques below compare the same two responses to a query. \
Decide which critique judges the responses more accurately. First analyse both critiques in \
<Analysis>...</Analysis> (are their claims about the responses true? is their conclusion \
right?), then write exactly one of these sentences in <Result>...</Result>:
{CRITIQUE_1_BETTER}
{CRITIQUE_2_BETTER}

"""
    + _PAIR_BLOCK
    + """

[Critique 1]
{critique_1}
[End of Critique 1]

[Critique 2]
{critique_2}
[End of Critique 2]"""
)

# a short checkable analysis before the verdict, for small judges (the reproduction's
# arithmetic pairs, scripts/repro/judge_common.py): the analysis restates both answers and the
# checked fact, and the verdict follows from them
_ANALYSIS_SHORT_V1 = f"""Question: {{prompt}}
Response 1: {{response_1}}
Response 2: {{response_2}}
Which response is correct? Check the answer in <Analysis>...</Analysis>, then reply \
<Result>{RESULT_1_BETTER}</Result> or <Result>{RESULT_2_BETTER}</Result>."""

_ANALYSIS_CRITIQUE_SHORT_V1 = f"""Question: {{prompt}}
Response 1: {{response_1}}
Response 2: {{response_2}}
Critique 1: {{critique_1}}
Critique 2: {{critique_2}}
Which critique checks the answer correctly? Check it in <Analysis>...</Analysis>, then reply \
<Result>{CRITIQUE_1_BETTER}</Result> or <Result>{CRITIQUE_2_BETTER}</Result>."""

JUDGE_TEMPLATES: dict[str, JudgeTemplate] = {
    "consistrm-v1": JudgeTemplate(
        name="consistrm-v1",
        description="ConsistRM format: criteria, analysis, result; delimited query and responses",
        text=_CONSISTRM_V1,
    ),
    "consistrm-v1-short": JudgeTemplate(
        name="consistrm-v1-short",
        description="the same output format in five lines, for tiny CPU models",
        text=_CONSISTRM_V1_SHORT,
    ),
    "verdict-v1": JudgeTemplate(
        name="verdict-v1",
        description="two balanced examples, the result tag only (judge tags: [Result]); CPU demos",
        text=_VERDICT_V1,
    ),
    "verdict-short-v1": JudgeTemplate(
        name="verdict-short-v1",
        description=(
            "no examples, the result tag only, 'Response 1 is better/worse than Response 2': "
            "with the prefix '<Result>Response 1 is' the verdict is one word and both verdicts "
            "end alike (judge tags: [Result]); the CPU judge demo"
        ),
        text=_VERDICT_SHORT_V1,
    ),
    "reflectrm-v1": JudgeTemplate(
        name="reflectrm-v1",
        description="ReflectRM response preference: analysis then result (tags: Analysis, Result)",
        text=_REFLECTRM_V1,
    ),
    "reflectrm-critique-v1": JudgeTemplate(
        name="reflectrm-critique-v1",
        description=(
            "ReflectRM analysis preference (self-reflection): which of two critiques of the same "
            "pair is better, 'Critique X is better than Critique Y' (tags: Analysis, Result)"
        ),
        text=_REFLECTRM_CRITIQUE_V1,
        subject="Critique",
    ),
    "analysis-short-v1": JudgeTemplate(
        name="analysis-short-v1",
        description=(
            "a short checkable analysis, then the result (tags: Analysis, Result); small judges"
        ),
        text=_ANALYSIS_SHORT_V1,
    ),
    "analysis-critique-short-v1": JudgeTemplate(
        name="analysis-critique-short-v1",
        description="which of two short analyses checks the answer correctly (tags: Analysis, "
        "Result; 'Critique X is better than Critique Y'); reflection of small judges",
        text=_ANALYSIS_CRITIQUE_SHORT_V1,
        subject="Critique",
    ),
}


def judge_template(name: str) -> JudgeTemplate:
    """The registered template called ``name``; a ValueError listing the names otherwise."""
    try:
        return JUDGE_TEMPLATES[name]
    except KeyError:
        raise ValueError(
            f"unknown judge template {name!r}; available: {', '.join(JUDGE_TEMPLATES)}. Fix: "
            "set template= to one of these."
        ) from None


def render_judge_prompt(name: str, *, prompt: str, response_1: str, response_2: str) -> str:
    """The judge's user message for one ordered pair (the chat template is applied later, by
    :class:`~lit_rlhf.data.PromptDataModule`). Braces in the texts are kept as they are."""
    template = judge_template(name)
    if template.subject != "Response":
        raise ValueError(
            f"template {name!r} compares critiques; render it with render_reflection_prompt"
        )
    return template.text.format(prompt=prompt, response_1=response_1, response_2=response_2)


def render_reflection_prompt(
    name: str, *, prompt: str, response_1: str, response_2: str, critique_1: str, critique_2: str
) -> str:
    """The judge's user message comparing two critiques of one ordered pair (ReflectRM's
    analysis preference); ``name`` must be a ``subject="Critique"`` template."""
    template = judge_template(name)
    if template.subject != "Critique":
        raise ValueError(
            f"template {name!r} compares responses, not critiques. Fix: use one of "
            + ", ".join(n for n, t in JUDGE_TEMPLATES.items() if t.subject == "Critique")
        )
    return template.text.format(
        prompt=prompt,
        response_1=response_1,
        response_2=response_2,
        critique_1=critique_1,
        critique_2=critique_2,
    )


class PreferencePair(NamedTuple):
    """One pair in its canonical order, before order-swap augmentation. A reflection pair
    (ReflectRM's analysis preference) also holds two critiques of the pair; its label says which
    critique is better."""

    pair_id: str  # stable: the source's id, or a hash of the texts
    prompt: str  # the query; a multi-turn context rendered as "User: ...\n\nAssistant: ..."
    response_1: str
    response_2: str
    label: int | None  # -1: the first (response or critique) better, +1: the second, None: unknown
    subset: str  # the source's category, "" when none
    critiques: tuple[str, str] | None = None  # a reflection pair's two critiques
    comparison: str = ""  # which comparison of a benchmark row ("c0r2": RM-Bench), "" if one

    def reversed_order(self) -> PreferencePair:
        """The pair shown the other way round: the responses swapped, or for a reflection pair
        the critiques (its critiques name the responses by position, so those stay)."""
        label = None if self.label is None else -self.label
        if self.critiques is not None:
            return self._replace(critiques=self.critiques[::-1], label=label)
        return self._replace(response_1=self.response_2, response_2=self.response_1, label=label)


def judge_rows(
    pairs: Iterable[PreferencePair],
    *,
    template: str,
    swap: SwapMode,
    seed: int,
    task: str,
    critique_template: str = "reflectrm-critique-v1",
) -> list[dict[str, Any]]:
    """The rows of ``pairs`` (columns in :mod:`lit_rlhf.data.pairs`) rendered with ``template``
    (reflection pairs with ``critique_template``), with ``swap`` applied: ``"both"`` puts each
    pair's swapped copy right after it; ``"random"`` flips a pair by a coin seeded by (``seed``,
    pair id)."""
    rows = []
    for pair in pairs:
        if swap == "both":
            orders = [False, True]
        else:
            orders = [swap == "random" and seeded_coin(seed, pair.pair_id, "swap")]
        for swapped in orders:
            shown = pair.reversed_order() if swapped else pair
            rows.append(
                {
                    "query_id": pair.pair_id + ("#swap" if swapped else ""),
                    "family_id": pair.pair_id,
                    "task": task,
                    **_rendered(shown, template, critique_template),
                    "label": shown.label,
                    "swapped": swapped,
                    "comparison": pair.comparison,
                }
            )
    return rows


def _rendered(pair: PreferencePair, template: str, critique_template: str) -> dict[str, Any]:
    texts = {"prompt": pair.prompt, "response_1": pair.response_1, "response_2": pair.response_2}
    if pair.critiques is None:
        question = render_judge_prompt(template, **texts)
        critiques: tuple[str | None, str | None] = (None, None)
        subject, subset = "Response", pair.subset
    else:
        critiques = pair.critiques
        question = render_reflection_prompt(
            critique_template, **texts, critique_1=critiques[0], critique_2=critiques[1]
        )
        subject, subset, template = "Critique", "reflection", critique_template
    return {
        "question": question,
        "query": pair.prompt,
        "response_1": pair.response_1,
        "response_2": pair.response_2,
        "critique_1": critiques[0],
        "critique_2": critiques[1],
        "subject": subject,
        "subset": subset,
        "template": template,
    }


def require_label(row: Mapping[str, Any], index: int, *, user: str, fix: str) -> int:
    """The row's gold label, -1 (response 1 better) or +1 (response 2 better); a ValueError
    naming the row, its query, what needs the label (``user``) and the ``fix`` otherwise."""
    label = row.get("label")
    if label not in (-1, 1):
        raise ValueError(
            f"row {index} (query {row.get('query_id', '?')!r}) has label={label!r}; {user} needs "
            f"-1 (response 1 better) or +1 (response 2 better). Fix: {fix}"
        )
    return int(label)


def seeded_coin(seed: int, key: str, salt: str) -> bool:
    """A fair coin determined by (seed, key, salt): independent of row order and slicing."""
    return hashlib.sha1(f"{salt}/{seed}/{key}".encode()).digest()[0] % 2 == 1


def check_pair_options(
    template: str,
    swap: str,
    num_examples: int | None,
    critique_template: str = "reflectrm-critique-v1",
) -> None:
    """Validates the arguments every pair source shares, at construction (config) time."""
    if judge_template(template).subject != "Response":
        raise ValueError(
            f"template {template!r} compares critiques, and a pair source renders response "
            "pairs. Fix: use a response template, e.g. reflectrm-v1 or consistrm-v1 (reflection "
            "records take critique_template=)."
        )
    if judge_template(critique_template).subject != "Critique":
        raise ValueError(
            f"critique_template {critique_template!r} compares responses. Fix: use a critique "
            "template, e.g. reflectrm-critique-v1."
        )
    if swap not in _SWAP_MODES:
        raise ValueError(f"swap must be one of {_SWAP_MODES}, got {swap!r}")
    if num_examples is not None and num_examples < 1:
        raise ValueError(f"num_examples must be >= 1 or None, got {num_examples}")
