"""The code tool as an environment (``PythonCodeEnv``, on the generic ``ToolEnv``): a call runs
in the sandbox and its output comes back as the result; code that raises is a result, code
stopped by a limit is an error observation and a fault; the tag rules are ToolEnv's."""

from __future__ import annotations

import copy

import pytest

from lit_rlhf.envs import PythonCodeEnv, ToolEnv, check_environment


@pytest.fixture(scope="module")
def env():
    env = PythonCodeEnv(timeout_s=2.0)
    check_environment(env)
    env.reset({})
    return env


def test_a_python_call_runs_in_the_sandbox_and_returns_its_output(env):
    result = env.step("Let me compute. <tool>python: print(17 * 23)</tool>")
    assert result.observation.startswith("<result>") and "391" in result.observation
    assert result.tool_call and result.fault is None and not result.done
    assert env.calls == 1


def test_code_that_raises_is_a_result_with_its_traceback(env):
    result = env.step("<tool>python: print(1 / 0)</tool>")
    assert result.observation.startswith("<result>") and "ZeroDivisionError" in result.observation
    assert result.fault is None


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("while True: pass", "exit: timeout"),
        ("import socket; socket.socket().connect(('127.0.0.1', 80))", "exit: blocked"),
    ],
    ids=["timeout", "socket"],
)
def test_code_stopped_by_a_limit_is_an_error_and_a_fault(env, code, reason):
    result = env.step(f"<tool>python: {code}</tool>")
    assert result.observation.startswith("<error>") and reason in result.observation
    assert result.fault == "python error" and result.tool_call and not result.done


def test_tag_rules_answer_unknown_tool_and_malformed_call():
    env = copy.deepcopy(ToolEnv({"upper": str.upper}))  # episodes step deep copies
    assert env.step("<tool>upper: abc</tool>").observation == "<result>ABC</result>"
    assert env.step("<answer>42</answer>").done
    assert env.step("no call at all").done
    unknown = env.step("<tool>shell: ls</tool>")
    assert unknown.fault == "unknown tool" and "the tools are: upper" in unknown.observation
    assert env.step("<tool>upper abc</tool>").fault == "malformed tool call"
    with pytest.raises(ValueError, match="at least one tool"):
        ToolEnv({})
