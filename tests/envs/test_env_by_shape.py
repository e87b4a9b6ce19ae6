"""Environments and engines are accepted by shape (``lit_rlhf.shapes``): the CLI's types ask for
callable methods, never for the user's annotations, and a class without one is refused naming
the method and the class. The CLI round trip is in tests/envs/test_user_envs_cli.py."""

from __future__ import annotations

import re

import pytest
from jsonargparse import ArgumentParser

from lit_rlhf.envs import (
    CountdownCalculatorEnv,
    Environment,
    EnvironmentLike,
    StepResult,
    check_environment,
)
from lit_rlhf.rollout import (
    DecodeLoopEngine,
    GenerationEngineLike,
    HFGenerationEngine,
    engine_refusal,
)


class Unannotated:
    def reset(self, row):
        self.row = row

    def step(self, turn):
        return StepResult("ok", done=True)


class OtherAnnotations:  # annotations the protocol does not have
    def reset(self, row: dict[str, int], extra: int = 0) -> bool:
        return True

    def step(self, turn: bytes) -> tuple[str, float]:
        return ("ok", 0.0)


class Subclass(Environment):
    def reset(self, row) -> None:
        pass

    def step(self, turn: str) -> StepResult:
        return StepResult("ok", done=True)


class NoStep:
    def reset(self, row):
        pass


class StepNotCallable:
    step = 3

    def reset(self, row):
        pass


@pytest.mark.parametrize("cls", [Unannotated, OtherAnnotations, Subclass, CountdownCalculatorEnv])
def test_any_class_with_reset_and_step_is_an_environment(cls: type) -> None:
    assert issubclass(cls, EnvironmentLike)
    assert isinstance(cls(), EnvironmentLike)
    check_environment(cls())


@pytest.mark.parametrize(("cls", "method"), [(NoStep, "step(turn)"), (StepNotCallable, "step")])
def test_a_missing_method_is_refused_naming_method_and_class(cls: type, method: str) -> None:
    assert not issubclass(cls, EnvironmentLike)
    with pytest.raises(TypeError, match=re.escape(f"{cls.__qualname__} has no method {method}")):
        check_environment(cls())


def test_an_explicit_subclass_of_a_user_subclass_is_not_judged_by_shape() -> None:
    class Mine(EnvironmentLike):  # a user's own base: ordinary inheritance decides
        def reset(self, row) -> None:
            pass

        def step(self, turn: str) -> StepResult:
            return StepResult("ok")

    assert issubclass(Mine, EnvironmentLike)
    assert not issubclass(Unannotated, Mine)


class LooseEngine(HFGenerationEngine):
    def generate(self, model, input_ids, attention_mask, tokenizer, **kwargs):  # unannotated
        return super().generate(model, input_ids, attention_mask, tokenizer, **kwargs)


class NoSync:
    temperature = 1.0

    def generate(self, *args, **kwargs):
        return None


def test_engines_by_shape() -> None:
    for cls in (HFGenerationEngine, DecodeLoopEngine, LooseEngine):
        assert issubclass(cls, GenerationEngineLike)
        assert engine_refusal(cls) is None
    assert not issubclass(NoSync, GenerationEngineLike)
    assert "NoSync has no method sync_weights" in (engine_refusal(NoSync) or "")


def test_jsonargparse_accepts_unannotated_classes_by_class_path() -> None:
    """The mechanism the CLI relies on, on a bare jsonargparse parser."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--environment", type=EnvironmentLike | None)
    parser.add_argument("--engine", type=GenerationEngineLike | None)
    here = __name__
    for name in ("Unannotated", "OtherAnnotations", "Subclass"):
        cfg = parser.parse_args([f"--environment={here}.{name}"])
        built = parser.instantiate_classes(cfg)
        assert type(built.environment).__name__ == name
    cfg = parser.parse_args([f"--engine={here}.LooseEngine"])
    assert isinstance(parser.instantiate_classes(cfg).engine, LooseEngine)
    with pytest.raises(Exception, match="EnvironmentLike"):
        parser.parse_args([f"--environment={here}.NoStep"])
