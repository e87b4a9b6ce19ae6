"""Rewards written the way users write them (TRL-style functions, untyped classes), named by
import path in the reward tests and the CLI test."""

from __future__ import annotations

import numpy as np
import torch


def brevity(prompts, completions, **kwargs):  # TRL's convention, no type hints
    return [1.0 / (1.0 + len(c)) for c in completions]


def has_digit(completions, target=None, **kwargs):  # only the arguments it needs, by keyword
    # a row field arrives as a keyword argument holding that field for every sample
    assert target is not None and len(target) == len(completions)
    return torch.tensor([float(any(ch.isdigit() for ch in c)) for c in completions])


def only_short(prompts, completions, **kwargs):  # None: "no score for this sample"
    return [1.0 if len(c) < 12 else None for c in completions]


def never_scores(prompts, completions, **kwargs):
    return [None] * len(completions)


class Untyped:
    """A class whose ``__call__`` has no type hints and returns a NumPy array."""

    def __init__(self, scale=1.0):
        self.scale = scale

    def __call__(self, prompts, completions, rows):
        return np.full(len(completions), self.scale)


def returns_text(prompts, completions, **kwargs):
    return "great answer"


def returns_too_few(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def returns_2d(prompts, completions, **kwargs):
    return np.zeros((len(completions), 2))


def returns_strings(prompts, completions, **kwargs):
    return ["1.0"] * len(completions)
