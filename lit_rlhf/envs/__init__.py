"""Multi-turn environments and tools (above rewards, below the training core): the
:class:`Environment` protocol, the tag tool-call format, the example environments, the
sandboxed Python code tool (:func:`run_python`, :class:`PythonTool`), environments of named
tools (:class:`ToolEnv`, :class:`PythonCodeEnv`) and demonstrations for a supervised warm start
(:func:`scripted_messages`)."""

from lit_rlhf.envs.base import (
    Environment,
    EnvironmentLike,
    StepResult,
    check_environment,
    environment_refusal,
)
from lit_rlhf.envs.calculator import CountdownCalculatorEnv
from lit_rlhf.envs.demos import scripted_messages
from lit_rlhf.envs.guess_number import GuessNumberEnv, GuessNumberPrompts, episode_reward_only
from lit_rlhf.envs.sandbox import ExitReason, PythonTool, SandboxResult, run_python
from lit_rlhf.envs.tool_env import PythonCodeEnv, ToolEnv
from lit_rlhf.envs.tools import ToolCall, ToolCallError, parse_tool_call

__all__ = [
    "CountdownCalculatorEnv",
    "Environment",
    "EnvironmentLike",
    "ExitReason",
    "GuessNumberEnv",
    "GuessNumberPrompts",
    "PythonCodeEnv",
    "PythonTool",
    "SandboxResult",
    "StepResult",
    "ToolCall",
    "ToolCallError",
    "ToolEnv",
    "check_environment",
    "environment_refusal",
    "episode_reward_only",
    "parse_tool_call",
    "run_python",
    "scripted_messages",
]
