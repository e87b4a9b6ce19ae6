"""Environments made of named tools in the tag format (:mod:`lit_rlhf.envs.tools`).

:class:`ToolEnv` answers each agent turn: an ``<answer>`` (or a turn that calls no tool) ends the
episode; ``<tool>NAME: ARGUMENT</tool>`` runs that tool on the argument and returns its text as
``<result>...</result>``; a malformed call, an unknown tool or a tool that refuses its argument
(raises ``ValueError``) is answered with ``<error>...</error>`` and counted as a fault. The
environment gives no reward of its own: the module's reward scores the whole transcript.

:class:`PythonCodeEnv` is the one with the sandboxed code tool (:func:`run_python`: CPU time,
memory, no network, writes only in a scratch folder, a wall-clock timeout): the agent runs
``<tool>python: print(17 * 23)</tool>`` and reads ``<result>exit: ok\\nstdout:\\n391</result>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lit_rlhf.envs.base import StepResult
from lit_rlhf.envs.sandbox import PythonTool
from lit_rlhf.envs.tools import ToolCallError, error_text, parse_tool_call, result_text

Tool = Callable[[str], str]


class ToolEnv:
    """Args:
    tools: tool name -> a callable from the call's argument to the result's text; it raises
        ``ValueError`` (its message becomes the ``<error>`` observation) for an argument it
        refuses.
    max_call_chars: longer calls are refused (an ``<error>`` observation and a fault).
    """

    def __init__(self, tools: Mapping[str, Tool], max_call_chars: int = 1000) -> None:
        if not tools:
            raise ValueError("ToolEnv needs at least one tool. Fix: pass tools={'name': fn}.")
        if max_call_chars < 1:
            raise ValueError(f"max_call_chars must be >= 1, got {max_call_chars}")
        self.tools = dict(tools)
        self.max_call_chars = max_call_chars
        self.calls = 0

    def reset(self, row: Mapping[str, Any]) -> None:
        self.calls = 0

    def step(self, turn: str) -> StepResult:
        """A well-formed call (of any tool name) is flagged ``tool_call``; a call in a turn that
        also holds an ``<answer>`` is not run and not flagged."""
        if "<answer>" in turn:
            return StepResult("", done=True)
        try:
            call = parse_tool_call(turn, max_chars=self.max_call_chars)
        except ToolCallError as err:
            return StepResult(error_text(str(err)), fault="malformed tool call")
        if call is None:
            return StepResult("", done=True)
        tool = self.tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted(self.tools))
            reason = f"unknown tool {call.name!r}; the tools are: {names}"
            return StepResult(error_text(reason), fault="unknown tool", tool_call=True)
        self.calls += 1
        try:
            text = tool(call.argument)
        except ValueError as err:
            return StepResult(error_text(str(err)), fault=f"{call.name} error", tool_call=True)
        return StepResult(result_text(text), tool_call=True)


class PythonCodeEnv(ToolEnv):
    """The sandboxed Python code tool as an environment (tool name ``python``).

    Args:
        timeout_s: wall-clock limit of one call; keep it below the module's
            ``env_step_timeout`` (default 5 s), which answers a step that runs longer.
        memory_mb: address-space limit of one call.
        max_output_chars: the most characters kept of stdout and of stderr each.
        allow_weak_sandbox: run the code even where the sandbox's OS layers (namespaces,
            seccomp) cannot be had, e.g. a non-root trainer on a host that blocks unprivileged
            user namespaces (logged as a warning); by default the constructor raises
            :class:`~lit_rlhf.envs.sandbox.WeakSandboxError` there.

    Code that raises is answered with its traceback's tail (a result the agent learns from);
    code stopped by a limit (timeout, memory, a refused operation such as a socket or a write
    outside the scratch folder) is answered as an ``<error>`` and counted as a fault.
    ``layers`` holds the sandbox layers of the latest call (``SandboxResult.layers``).
    """

    def __init__(
        self,
        timeout_s: float = 3.0,
        memory_mb: int = 256,
        max_output_chars: int = 500,
        allow_weak_sandbox: bool = False,
    ):
        self.sandbox = PythonTool(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_output_chars=max_output_chars,
            allow_weak_sandbox=allow_weak_sandbox,
        )
        self.layers: tuple[str, ...] = ()
        super().__init__({"python": self._run}, max_call_chars=4000)

    def _run(self, code: str) -> str:
        result = self.sandbox.run(code)
        self.layers = result.layers
        text = result.observation(max_chars=2 * self.sandbox.max_output_chars + 200)
        if result.reason in ("timeout", "memory", "blocked"):
            raise ValueError(text)
        return text
