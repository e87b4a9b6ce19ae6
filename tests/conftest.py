"""Shared fixtures: an offline, per-session model cache and the tiny builtin model."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import settings

# Property tests draw from a fixed seed: the same examples on every machine and every run, so a
# rare draw cannot fail one CI run and pass the next (and no example database is kept).
settings.register_profile("lit_rlhf", derandomize=True, database=None)
settings.load_profile("lit_rlhf")

_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session", autouse=True)
def _offline_cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Point LIT_RLHF_CACHE at a session temp dir and force the Hugging Face libraries offline.

    huggingface_hub and datasets read HF_HUB_OFFLINE once, at import, and test collection has
    already imported them; so their module-level flags are flipped too, and restored after.
    """
    env = {**_OFFLINE_ENV, "LIT_RLHF_CACHE": str(tmp_path_factory.mktemp("lit_rlhf_cache"))}
    saved_env = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    flags = [(name, "HF_HUB_OFFLINE") for name in ("huggingface_hub.constants", "datasets.config")]
    saved_flags = [
        (sys.modules[name], attr, getattr(sys.modules[name], attr))
        for name, attr in flags
        if name in sys.modules
    ]
    for module, attr, _ in saved_flags:
        setattr(module, attr, True)
    yield
    for module, attr, value in saved_flags:
        setattr(module, attr, value)
    for key, value in saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """Local folder of ``builtin:tiny-llama`` (random weights + tiny BPE tokenizer with a chat
    template), built once per session in the session cache."""
    from lit_rlhf.models import resolve

    return resolve("builtin:tiny-llama")
