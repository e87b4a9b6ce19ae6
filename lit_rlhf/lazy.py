"""A module imported on first use, so that ``lit-rlhf --help`` and a refused config do not pay
for it: ``datasets`` (with pandas and pyarrow, about a second) is needed only when data loads.

``lazy_module(name)`` returns a stand-in module object: its first public attribute read
(``datasets.Dataset``) imports the real module and copies its names in. Probes of dunder names
(``__args__``, ``__spec__``: jsonargparse reads every global of a module whose signatures it
resolves) do not import it, and the stand-in is not put in ``sys.modules``, so an ``import``
statement anywhere still gets the real module.

The static import for the type checker goes under ``if MYPY:`` (mypy treats the name ``MYPY`` as
``typing.TYPE_CHECKING``), not under ``if TYPE_CHECKING:``, which jsonargparse executes::

    from lit_rlhf.lazy import MYPY, lazy_module

    if MYPY:
        import datasets
    else:
        datasets = lazy_module("datasets")

``Table`` is ``datasets.Dataset`` for the type checker and ``Any`` at run time: the return type of
a data source's ``load()``, which jsonargparse evaluates when it checks a class against the
source protocol.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

MYPY = False  # True for mypy only (see the module docstring)

if MYPY:
    from datasets import Dataset as Table
else:
    Table = Any  # a source's ``load()`` type, which jsonargparse resolves (protocol checks)


class _Deferred(ModuleType):
    def __getattr__(self, attr: str) -> Any:  # called for names not loaded yet
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        module = importlib.import_module(self.__name__)
        self.__dict__.update(
            {k: v for k, v in vars(module).items() if not (k.startswith("__") and k != "__all__")}
        )
        return getattr(module, attr)


def lazy_module(name: str) -> ModuleType:
    """A stand-in for the module ``name`` that imports it at its first public attribute read."""
    return _Deferred(name)
