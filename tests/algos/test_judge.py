import time

import pytest

from lit_rlhf.algos import critique_text, judge_format_ok, judge_verdict, parse_verdict
from lit_rlhf.algos.judge import JudgeFormat, response_text, strip_think

R1 = "Response 1 is better than Response 2"
R2 = "Response 2 is better than Response 1"
HEAD = "<Criterion>accuracy first</Criterion>\n<Analysis>1 is right, 2 is not.</Analysis>\n"

PARSER_CASES = [
    pytest.param(f"{HEAD}<Result>{R1}</Result>", "Response", -1, id="valid-minus-1"),
    pytest.param(f"{HEAD}<Result>{R2}</Result>", "Response", 1, id="valid-plus-1"),
    pytest.param(f"{HEAD}<Result>Response 1 is better than", "Response", None, id="truncated"),
    pytest.param(f"{HEAD}<Result>{R1}", "Response", None, id="verdict-but-not-closed"),
    pytest.param(f"{HEAD}{R1}", "Response", None, id="missing-result"),
    pytest.param(f"{HEAD}<Result></Result>", "Response", None, id="empty-result"),
    pytest.param(f"{HEAD}<Result> \n\t </Result>", "Response", None, id="blank-result"),
    pytest.param(f"<Result>{R1}. {R2}.</Result>", "Response", None, id="both-verdicts"),
    pytest.param("<Result>Both are equally good.</Result>", "Response", None, id="no-verdict"),
    pytest.param("<Result>Response 1 is better.</Result>", "Response", None, id="one-side-only"),
    pytest.param(f"<Result>I think {R1}</Result>", "Response", None, id="extra-words"),
    pytest.param(
        "<Result>Response 1 is slightly better than Response 2</Result>",
        "Response",
        None,
        id="hedged",
    ),
    pytest.param(
        "<Result>Response 1 is not better than Response 2</Result>", "Response", None, id="negated"
    ),
    # "X is worse than Y" reads as "Y is better than X".
    pytest.param(
        "<Result>Response 2 is worse than Response 1</Result>", "Response", -1, id="worse-than-2"
    ),
    pytest.param(
        "<Result>Response 1 is worse than Response 2</Result>", "Response", 1, id="worse-than-1"
    ),
    pytest.param(
        f"<Result>{R2}</Result>\nOn second thought, {R1}.", "Response", 1, id="text-after-close"
    ),
    # The last COMPLETE block counts; a restated block cut off by the length limit is ignored.
    pytest.param(
        f"<Result>{R1}</Result> Let me restate. <Result>{R2}",
        "Response",
        -1,
        id="complete-then-truncated",
    ),
    pytest.param(
        f"<Result>{R1}</Result> On reflection: <Result>{R2}</Result>",
        "Response",
        1,
        id="two-blocks-last-wins",
    ),
    pytest.param(f"</Result>{R1}<Result>", "Response", None, id="close-before-open"),
    pytest.param(
        "<RESULT>response 1 IS BETTER THAN RESPONSE 2</result>", "Response", -1, id="case"
    ),
    pytest.param(
        "<Result>\n  Response   2 is  better than\tResponse 1 \n</Result>\n",
        "Response",
        1,
        id="extra-whitespace",
    ),
    pytest.param(f"< Result >{R1}< / Result >", "Response", -1, id="spaces-inside-tags"),
    pytest.param(
        "<Result>**Response 1** is better than **Response 2**</Result>",
        "Response",
        -1,
        id="bold-subjects",
    ),
    pytest.param(f"<Result>**{R2}.**</Result>", "Response", 1, id="bold-sentence-and-period"),
    pytest.param(f"<Result>{R1}.</Result>", "Response", -1, id="trailing-period"),
    pytest.param(f"<Result>{R1}..</Result>", "Response", None, id="two-periods"),
    pytest.param(
        "<Result>Response\u00a01 is better than\u3000Response\u202f2</Result>",
        "Response",
        -1,
        id="unicode-whitespace",
    ),
    # No NFKC normalisation: full-width digits are not the numbers 1 and 2.
    pytest.param(
        "<Result>Response \uff11 is better than Response \uff12</Result>",
        "Response",
        None,
        id="full-width-digits",
    ),
    pytest.param("", "Response", None, id="empty-string"),
    pytest.param(
        "<Result>Response 1 is better than Response 1</Result>", "Response", None, id="same-number"
    ),
    pytest.param(
        "<Result>Response 3 is better than Response 1</Result>", "Response", None, id="number-3"
    ),
    pytest.param(
        "<Result>Response 01 is better than Response 2</Result>", "Response", None, id="number-01"
    ),
    pytest.param(
        "<Result>Critique 2 is better than Critique 1</Result>", "Critique", 1, id="critique"
    ),
    pytest.param(
        "<Result>Critique 2 is better than Critique 1</Result>",
        "Response",
        None,
        id="critique-read-as-response",
    ),
    pytest.param(f"<Result>{R1}</Result>", "Critique", None, id="response-read-as-critique"),
]


@pytest.mark.parametrize(("text", "subject", "expected"), PARSER_CASES)
def test_parse_verdict_table(text, subject, expected):
    assert parse_verdict(text, subject=subject) == expected


def test_parse_verdict_scans_only_the_tail_and_is_fast_on_long_garbage():
    # 8 MB of unclosed tags and 8 MB of '<': only the last max_chars characters are scanned.
    for garbage in ("<Result>" * 1_000_000, "<" * 8_000_000):
        start = time.perf_counter()
        assert parse_verdict(garbage) is None
        assert parse_verdict(garbage + f"<Result>{R2}</Result>") == 1
        assert time.perf_counter() - start < 1.0
    # A block that starts before the scanned tail is not found.
    block = f"<Result>{R1}</Result>"
    assert parse_verdict(block + " " * 100, max_chars=len(block) + 100) == -1
    assert parse_verdict(block + " " * 100, max_chars=len(block) + 99) is None
    with pytest.raises(ValueError, match="max_chars"):
        parse_verdict(block, max_chars=0)


@pytest.mark.parametrize(
    ("text", "tags", "subject", "expected"),
    [
        pytest.param(f"{HEAD}<Result>{R1}</Result>", None, "Response", True, id="valid"),
        pytest.param(
            f"<think>hmm</think>\nLet me judge.\n{HEAD}<Result>{R2}</Result>\n \n",
            None,
            "Response",
            True,
            id="think-and-text-before-blocks-whitespace-after",
        ),
        # the ConsistRM authors' rule: only the end of turn may follow </Result>
        pytest.param(
            f"{HEAD}<Result>{R2}</Result>\nDone.", None, "Response", False, id="text-after-result"
        ),
        pytest.param(
            f"{HEAD}<Result>{R2}</Result><Analysis>x", None, "Response", False, id="tag-after"
        ),
        # a think trace is stripped before the check: empty (Qwen3 /no_think) or full
        pytest.param(
            f"<think>\n\n</think>\n\n{HEAD}<Result>{R1}</Result>",
            None,
            "Response",
            True,
            id="empty-think",
        ),
        pytest.param(
            f"<think>draft: <Result>{R2}</Result></think>{HEAD}<Result>{R1}</Result>",
            None,
            "Response",
            True,
            id="tags-inside-think-do-not-count",
        ),
        pytest.param(
            f"<think>still thinking {HEAD}<Result>{R1}</Result>",
            None,
            "Response",
            False,
            id="unclosed-think",
        ),
        pytest.param(
            f"<Analysis>a</Analysis><Result>{R1}</Result>", None, "Response", False, id="no-crit"
        ),
        pytest.param(
            f"<Analysis>a</Analysis><Result>{R1}</Result>",
            ("Analysis", "Result"),
            "Response",
            True,
            id="reflectrm-tags",
        ),
        pytest.param(
            "<Analysis>a</Analysis><Result>Critique 1 is better than Critique 2</Result>",
            ("Analysis", "Result"),
            "Critique",
            True,
            id="reflectrm-critique",
        ),
        pytest.param(
            f"<Analysis>a</Analysis><Criterion>c</Criterion><Result>{R1}</Result>",
            None,
            "Response",
            False,
            id="wrong-order",
        ),
        pytest.param(
            f"<Criterion>c<Analysis>a</Criterion></Analysis><Result>{R1}</Result>",
            None,
            "Response",
            False,
            id="overlapping",
        ),
        pytest.param(
            f"{HEAD}<Analysis>again</Analysis><Result>{R1}</Result>",
            None,
            "Response",
            False,
            id="analysis-twice",
        ),
        pytest.param(
            f"<Criterion>c</Criterion><Analysis>a<Result>{R1}</Result>",
            None,
            "Response",
            False,
            id="analysis-unclosed",
        ),
        pytest.param(
            f"{HEAD}<Result>{R1}</Result><Result>{R1}</Result>",
            None,
            "Response",
            False,
            id="result-twice",
        ),
        pytest.param(f"{HEAD}<Result>a tie</Result>", None, "Response", False, id="no-verdict"),
        pytest.param(f"{HEAD}<Result>{R1}", None, "Response", False, id="truncated"),
        pytest.param(
            f"<criterion>c</CRITERION><analysis>a</analysis><result>{R2}</result>",
            None,
            "Response",
            True,
            id="case-insensitive-tags",
        ),
    ],
)
def test_judge_format_ok(text, tags, subject, expected):
    kwargs = {} if tags is None else {"tags": tags}
    assert judge_format_ok(text, subject=subject, **kwargs) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(f"{HEAD}<Result>{R1}</Result>", HEAD.strip(), id="before-result"),
        pytest.param("  just an analysis \n", "just an analysis", id="no-result"),
        pytest.param(
            f"first <Result>{R1}</Result> second\n<result>{R2}</result>",
            f"first <Result>{R1}</Result> second",
            id="before-the-last-result",
        ),
        pytest.param(f"<Result>{R1}</Result>", "", id="nothing-before"),
        pytest.param("", "", id="empty"),
    ],
)
def test_critique_text(text, expected):
    assert critique_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("<think>\n\n</think>\n\nanswer", "\n\nanswer", id="empty-trace"),
        pytest.param("  <THINK>a < b</think>x</think>y", "x</think>y", id="first-close-ends-it"),
        pytest.param("<think>never closed <Result>", "", id="unclosed"),
        pytest.param("answer <think>late</think>", "answer <think>late</think>", id="not-leading"),
        pytest.param("", "", id="empty"),
    ],
)
def test_strip_think(text, expected):
    assert strip_think(text) == expected


def test_a_qwen3_think_trace_is_stripped_before_the_verdict_is_read():
    judged = f"<think>\nResponse 2 looks better at first.\n</think>\n\n{HEAD}<Result>{R1}</Result>"
    assert judge_verdict(judged) == -1
    assert JudgeFormat().verdict(judged) == -1
    # a trace cut by the length limit leaves no judgment, whatever it contains
    assert judge_verdict(f"<think>{HEAD}<Result>{R1}</Result>") is None
    # trailing text is malformed unless allowed (reading an off-the-shelf judge)
    trailing = f"{HEAD}<Result>{R2}</Result> Hope this helps!"
    assert judge_verdict(trailing) is None
    assert judge_verdict(trailing, allow_trailing_text=True) == 1


def test_response_text_is_the_whole_judgment_without_its_think_trace():
    judged = f"<think></think>\n{HEAD}<Result>{R1}</Result>\n"
    assert response_text(judged) == f"{HEAD}<Result>{R1}</Result>"
    assert critique_text(judged) == HEAD.strip()


def test_a_judge_format_can_allow_trailing_text():
    trailing = f"{HEAD}<Result>{R1}</Result>\n\nQuestion: the next few-shot example"
    assert JudgeFormat().verdict(trailing) is None
    assert JudgeFormat(allow_trailing_text=True).verdict(trailing) == -1
