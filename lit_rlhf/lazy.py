"""A module imported on first use, so that ``lit-rlhf --help`` and a refused config do not pay
for it: ``datasets`` (with pandas and pyarrow, about a second) is needed only when data loads.

``lazy_module(name)`` is the standard library's recipe (``importlib.util.LazyLoader``): the module
object goes into ``sys.modules`` at once and runs its code at the first attribute access, from
any importer. A module imported already is returned as it is.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name`` as a module whose code runs at its first attribute access."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
