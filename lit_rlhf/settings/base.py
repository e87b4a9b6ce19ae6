"""What every settings group shares: literal and range checks with dotted keys, construction
from a plain dict (a config, a checkpoint's hparams) that refuses unknown keys, and the map from
the flat argument names of lit-rlhf <= 0.x to the dotted paths (old checkpoints, Python callers).

A group is a frozen dataclass that subclasses :class:`SettingsGroup` (a dataclass without
fields) and sets ``GROUP``, the constructor argument it is taken as
(``model.init_args.<GROUP>.<field>``).
Fields are documented in the class docstring's ``Args:`` section: LightningCLI shows those lines
as ``--help`` and README's tables are generated from them (:func:`field_docs`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin, get_type_hints

G = TypeVar("G", bound="SettingsGroup")
Rule = tuple[str, bool, str]  # (field, ok, the range wanted)


@dataclasses.dataclass(frozen=True)
class SettingsGroup:
    """Base of the frozen dataclasses of one concern's settings. A dataclass itself (with no
    fields), so that jsonargparse sees a pure dataclass and parses a group as nested options
    (``--model.init_args.optim.lr``), not as a subclass with ``class_path`` / ``init_args``."""

    GROUP: ClassVar[str] = ""
    # field -> its flat argument name before groups, where the two differ (migration, messages)
    FLAT_NAMES: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        self._check_literals()
        self.refuse(self.rules())
        self.check()

    def rules(self) -> Sequence[Rule]:
        """(field, ok, wanted) range rules; the first that fails is refused."""
        return ()

    def check(self) -> None:
        """Checks across fields (a combination that would silently do nothing or the opposite)."""

    def key(self, name: str) -> str:
        """The field's full key as a config writes it."""
        return f"model.init_args.{self.GROUP}.{name}"

    def refuse(self, rules: Sequence[Rule]) -> None:
        for name, ok, wanted in rules:
            if not ok:
                raise ValueError(
                    f"{self.GROUP}.{name}={getattr(self, name)!r} must be {wanted}. Fix: set "
                    f"{self.key(name)} in that range."
                )

    def _check_literals(self) -> None:
        hints = get_type_hints(type(self))
        for spec in dataclasses.fields(self):
            hint = hints[spec.name]
            if get_origin(hint) is Literal and getattr(self, spec.name) not in get_args(hint):
                allowed = list(get_args(hint))
                raise ValueError(
                    f"{self.GROUP}.{spec.name}={getattr(self, spec.name)!r} is not one of "
                    f"{allowed}. Fix: set {self.key(spec.name)} to one of them."
                )

    @classmethod
    def coerce(cls: type[G], value: G | Mapping[str, Any] | None, base: G | None = None) -> G:
        """The group from an instance (itself), a plain dict (keys checked, merged onto
        ``base``, a module's default for the group) or None (``base``, else the defaults)."""
        base = base if base is not None else cls()
        if value is None:
            return base
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(
                f"{cls.GROUP} must be a {cls.__name__} or a dict of its fields, got "
                f"{type(value).__name__}. Fix: pass {cls.GROUP}={cls.__name__}(...) or a dict."
            )
        names = [f.name for f in dataclasses.fields(cls)]
        for key in value:
            if key not in names:
                raise ValueError(unknown_key_message(cls, key))
        return dataclasses.replace(base, **value)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (what hparams and checkpoints hold)."""
        return dataclasses.asdict(self)


def closest_field(group: type[SettingsGroup], name: str) -> str | None:
    """The field of ``group`` closest to a misspelt ``name`` (None: nothing close)."""
    close = difflib.get_close_matches(name, [f.name for f in dataclasses.fields(group)], n=1)
    return close[0] if close else None


def unknown_key_message(group: type[SettingsGroup], key: str) -> str:
    """One line naming the unknown key, the closest field and the group's fields."""
    close = closest_field(group, key)
    hint = f" Did you mean {group.GROUP}.{close}?" if close else ""
    names = ", ".join(f.name for f in dataclasses.fields(group))
    return f"Group '{group.GROUP}' does not accept option '{key}'.{hint} Fix: use one of {names}."


def flat_names(group: type[SettingsGroup]) -> dict[str, str]:
    """{flat argument name before groups: field} of one group."""
    fields = [f.name for f in dataclasses.fields(group)]
    return {group.FLAT_NAMES.get(name, name): name for name in fields}


def positive(value: float) -> bool:
    return 0 < value < math.inf


def non_negative(value: float) -> bool:
    return 0 <= value < math.inf


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
