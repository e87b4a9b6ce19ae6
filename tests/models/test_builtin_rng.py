"""Building a builtin model on first use leaves the caller's random state alone: a seeded run on a
fresh machine (empty model cache) samples what every later run samples. Before the fix, the tiny
model's ``torch.manual_seed`` reset the global generator inside the run, so the first run of a
config differed from its reruns (found by the served-teacher CLI test, whose first run built the
cache)."""

from __future__ import annotations

import torch

from lit_rlhf.models import TinyModelSpec
from lit_rlhf.models.builtin import resolve_builtin
from lit_rlhf.models.tiny import build_tiny_model


def _draw_after(build) -> torch.Tensor:
    torch.manual_seed(123)
    torch.rand(3)  # the run has drawn something already
    build()
    return torch.rand(5)


def test_building_a_builtin_on_first_use_leaves_the_global_generator_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_RLHF_CACHE", str(tmp_path))  # empty: the model is built here
    expected = _draw_after(lambda: None)
    assert torch.equal(_draw_after(lambda: resolve_builtin("builtin:tiny-llama")), expected)
    assert (tmp_path / next(p.name for p in tmp_path.iterdir()) / "config.json").exists()


def test_the_tiny_models_weights_depend_on_their_seed_only():
    spec = TinyModelSpec()
    torch.manual_seed(5)
    a = build_tiny_model(spec, 512, seed=0).state_dict()
    torch.manual_seed(6)
    b = build_tiny_model(spec, 512, seed=0).state_dict()
    c = build_tiny_model(spec, 512, seed=1).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
