"""Types checked by shape: the types the CLI checks injected objects against (an environment, a
generation engine), which accept any class that has the methods, annotated or not.

jsonargparse checks a class path against a ``typing.Protocol`` by comparing the signatures'
annotations with the protocol's (``implements_protocol``), so a class written without
annotations, with other ones, or in a module without ``from __future__ import annotations`` is
refused ("does not implement protocol", naming no method). Against a plain class it asks
``issubclass``, which an ABC answers through ``__subclasshook__``: a :class:`ByShape` subclass
answers yes for every class whose ``methods`` are all callable attributes, and leaves the
answer to ordinary inheritance otherwise. The protocols stay the static types.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence
from typing import Any, ClassVar


class ByShape(ABC):  # noqa: B024 (the subclasses declare the abstract methods)
    """Base of a type checked by shape: set ``methods`` on the direct subclass."""

    methods: ClassVar[tuple[str, ...]] = ()  # the callable attributes a class must have

    @classmethod
    def __subclasshook__(cls, other: type) -> Any:
        if "methods" not in cls.__dict__:  # a user's explicit subclass: inheritance decides
            return NotImplemented
        return True if not missing_methods(other, cls.methods) else NotImplemented


def missing_methods(obj: Any, names: Sequence[str]) -> list[str]:
    """The names in ``names`` that are not callable attributes of ``obj`` (a class or an
    instance)."""
    return [name for name in names if not callable(getattr(obj, name, None))]
