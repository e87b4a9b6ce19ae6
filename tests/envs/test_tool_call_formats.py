"""Tool calls in a chat template's own syntax (Hermes / Qwen2.5 style ``<tool_call>{json}``):
parsed with ``json.loads`` beside the tag format; the tools' schemas reach the prompt through
``chat_template_kwargs: {tools: [...]}``; the calculator environment answers either form, and
the answer is rendered with the template's ``tool`` role."""

from __future__ import annotations

import pytest

from lit_rlhf.data.prompts import render_chat_prompt
from lit_rlhf.envs import CountdownCalculatorEnv, ToolCall, ToolCallError, parse_tool_call
from lit_rlhf.models import load_tokenizer
from lit_rlhf.settings import EnvironmentSettings
from lit_rlhf.training.multiturn import MultiTurnRollout

# a minimal template with the Hermes tool syntax (tools in the system turn, tool turns wrapped)
HERMES = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\nCall one with "
    '<tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n{%- endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}\n<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>"
    "{%- else %}\n<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}"
)
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


@pytest.mark.parametrize(
    ("text", "call"),
    [
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>',
            ToolCall("calculator", "3*(4+5)"),
        ),
        (
            'x <tool_call>{"name": "python", "arguments": "print(1)"}</tool_call>',
            ToolCall("python", "print(1)"),
        ),
        (
            '<tool_call>{"name": "f", "parameters": {"a": 1, "b": 2}}</tool_call>',
            ToolCall("f", '{"a": 1, "b": 2}'),
        ),
        (
            '<tool>calculator: 1+1</tool> <tool_call>{"name": "f", "arguments": "x"}</tool_call>',
            ToolCall("calculator", "1+1"),
        ),  # whichever opens first
    ],
    ids=["one-argument", "string-arguments", "several-arguments", "tag-first"],
)
def test_json_tool_calls_are_parsed(text, call):
    assert parse_tool_call(text) == call


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}', "unclosed"),
        ("<tool_call>{name: calculator}</tool_call>", "not valid JSON"),
        ('<tool_call>["calculator"]</tool_call>', '"name": "TOOL"'),
        ('<tool_call>{"name": "calculator"}</tool_call>', "no arguments"),
        ("<tool_call>__import__('os').system('ls')</tool_call>", "not valid JSON"),
    ],
    ids=["unclosed", "bad-json", "not-an-object", "no-arguments", "code-is-not-run"],
)
def test_malformed_json_calls_are_refused(text, message):
    with pytest.raises(ToolCallError, match=message):
        parse_tool_call(text)


def test_the_calculator_answers_a_template_call_rendered_with_the_tool_role(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = HERMES
    prompt = render_chat_prompt(
        tokenizer, "Make 27 from 3, 4, 5.", chat_template_kwargs={"tools": [CALCULATOR]}
    )
    assert '"name": "calculator"' in prompt and "<tool_call>" in prompt
    env = CountdownCalculatorEnv()
    env.reset({})
    turn = '<tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>'
    result = env.step(turn)
    assert result.observation == "<result>27</result>" and result.fault is None
    loop = MultiTurnRollout(env, EnvironmentSettings())
    rendered = loop.render(tokenizer, result.observation)
    assert "<tool_response>\n<result>27</result>\n</tool_response>" in rendered
    assert rendered.rstrip().endswith("<|im_start|>assistant")
