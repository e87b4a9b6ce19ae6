"""The flat argument names of lit-rlhf before settings groups: refused from Python with the
dotted name to use, and regrouped when an old checkpoint's hyperparameters are read."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from lit_rlhf.settings.base import SettingsGroup, flat_names

C = TypeVar("C", bound=type)


def group_params(cls: type) -> dict[str, type[SettingsGroup]]:
    """{argument name: group class} of a class whose ``__init__`` takes settings groups."""
    params = inspect.signature(cls).parameters
    found = {}
    for name, param in params.items():
        default = param.default
        if isinstance(default, SettingsGroup):
            found[name] = type(default)
    return found


def flat_map(cls: type) -> dict[str, str]:
    """{old flat argument: dotted ``group.field``} for every group ``cls`` takes."""
    moved = {}
    for arg, group in group_params(cls).items():
        for flat, field in flat_names(group).items():
            moved[flat] = f"{arg}.{field}"
    return moved


def refuse_flat_arguments(cls: C) -> C:
    """Class decorator: a keyword that is now a group's field (``clip_low=0.2``) is refused with
    one line naming the group, instead of Python's bare "unexpected keyword argument"."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    own = set(inspect.signature(cls).parameters)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        moved = {k: v for k, v in flat_map(cls).items() if k in kwargs and k not in own}
        if moved:
            flat, dotted = next(iter(moved.items()))
            group, field = dotted.split(".")
            raise TypeError(
                f"{cls.__name__}({flat}=...) is a flat argument of lit-rlhf before settings "
                f"groups; it is now {dotted}. Fix: pass {group}={group_class_name(cls, group)}"
                f"({field}=...) (or a dict); in YAML: {group}: {{{field}: ...}}; a checkpoint "
                "written before the groups: load it through the lit-rlhf CLI (it regroups "
                "them), or pass its hparams through lit_rlhf.settings.regroup_flat."
            )
        init(self, *args, **kwargs)

    cls.__init__ = wrapper  # type: ignore[misc]
    return cls


def group_class_name(cls: type, arg: str) -> str:
    return group_params(cls)[arg].__name__


def take_groups(module: Any) -> dict[str, Any]:
    """The module's settings groups by argument name, read from ``module.hparams`` after
    ``save_hyperparameters``: each an instance or a dict (merged onto the argument's default in
    ``__init__``'s signature), validated; hparams then hold each group as a plain dict."""
    defaults = {
        name: param.default
        for name, param in inspect.signature(type(module)).parameters.items()
        if isinstance(param.default, SettingsGroup)
    }
    groups = {
        name: type(base).coerce(module.hparams.get(name), base) for name, base in defaults.items()
    }
    store_groups(module, groups)
    return groups


def store_groups(module: Any, groups: Mapping[str, SettingsGroup]) -> None:
    """Write each group into ``module.hparams`` (and the copy loggers log, ``hparams_initial``)
    as a plain dict, however the module was built: from the CLI, hparams hold dicts already;
    from Python, the dataclass instances."""
    initial = getattr(module, "_hparams_initial", None)
    for name, group in groups.items():
        module.hparams[name] = group.as_dict()
        if initial is not None:
            initial[name] = group.as_dict()


def regroup_flat(cls: type, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """An old checkpoint's flat hyperparameters moved into ``cls``'s groups (keys that are not
    flat names stay as they are); a group already present keeps its values."""
    moved = flat_map(cls)
    out: dict[str, Any] = {}
    for key, value in hparams.items():
        if key in moved and not isinstance(value, Mapping):
            group, field = moved[key].split(".")
            if isinstance(hparams.get(group), Mapping):
                continue  # the grouped form wins
            out.setdefault(group, {})[field] = value
        else:
            out[key] = value
    return out


def is_flat(cls: type, hparams: Mapping[str, Any]) -> bool:
    """Whether ``hparams`` were written before settings groups (a flat name, no group dict)."""
    moved = flat_map(cls)
    groups = group_params(cls)
    flat = any(k in moved and k not in groups for k in hparams)
    return flat and not any(isinstance(hparams.get(g), Mapping) for g in groups)
