"""Building and checking settings dataclasses: nested dicts in, frozen dataclasses out.

Every settings class of milegpo is a frozen dataclass that checks its own values in
``__post_init__`` with the helpers here, so a bad value is refused where the object is
built, with its dotted name (``algo.learning_rate must be a number > 0, got -1``).
:func:`from_dict` builds one from plain values (JSON, YAML, a run's ``config.json``),
sub-configs included, and refuses unknown keys with the list of valid ones.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def from_dict(cls: type[T], values: Mapping[str, Any] | T | None, where: str = "") -> T:
    """An instance of the dataclass ``cls`` from a dict of its fields (sub-configs as dicts or instances).

    ``values`` may already be an instance (returned as is) or None (the defaults). ``where``
    is the dotted prefix used in error messages (``"policy.lora"``).
    """
    if values is None:
        return cls()
    if isinstance(values, cls):
        return values
    if not isinstance(values, Mapping):
        raise ValueError(f"{where or cls.__name__} must be a mapping of {cls.__name__} fields, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        names = ", ".join(_dotted(where, name) for name in unknown)
        raise ValueError(f"unknown setting(s) {names}; valid: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    built = {}
    for name, value in values.items():
        sub = settings_class(hints[name])
        built[name] = from_dict(sub, value, _dotted(where, name)) if sub is not None and value is not None else value
    return cls(**built)


def settings_class(annotation: Any) -> type | None:
    """The dataclass an annotation names (``X`` or ``X | None``), else None."""
    candidates = typing.get_args(annotation) if typing.get_args(annotation) else (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _dotted(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def check_int(name: str, value: object, smallest: int, optional: bool = False) -> None:
    """``ValueError`` unless ``value`` is an int >= ``smallest`` (or None when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
        also = " or null" if optional else ""
        raise ValueError(f"{name} must be an integer >= {smallest}{also}, got {value!r}")


def check_number(name: str, value: object, positive: bool = True, optional: bool = False) -> None:
    """``ValueError`` unless ``value`` is a finite number > 0 (``positive``) or >= 0 (None when ``optional``).

    ``nan <= 0`` is False, so NaN has to be refused explicitly: it is.
    """
    if optional and value is None:
        return
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not finite or (value <= 0 if positive else value < 0):  # type: ignore[operator]
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a number {bound}{' or null' if optional else ''}, got {value!r}")


def check_type(name: str, value: object, kind: type | tuple[type, ...], what: str, optional: bool = False) -> None:
    """``ValueError`` unless ``value`` is an instance of ``kind`` (described as ``what``)."""
    if optional and value is None:
        return
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # True is an int too
        raise ValueError(f"{name} must be {what}{' or null' if optional else ''}, got {value!r}")


def with_overrides(cls: type[T], config: T | Mapping[str, Any] | None, overrides: Mapping[str, Any],
                   where: str = "") -> T:
    """``config`` (an instance, a dict of its fields or None for the defaults) with some fields
    replaced; a sub-config given as a dict replaces that whole sub-config (its missing keys take
    their defaults)."""
    config = from_dict(cls, config, where)
    if not overrides:
        return config
    current = {f.name: getattr(config, f.name) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return from_dict(cls, {**current, **overrides}, where)


def field_names(cls: type) -> set[str]:
    """The field names of the settings dataclass ``cls``."""
    return {f.name for f in dataclasses.fields(cls)}


def to_dict(config: object) -> dict[str, Any]:
    """A settings dataclass as plain nested values (JSON- and YAML-ready).

    A non-finite float (only a credit setting may be one: ``memory_half_life: inf``) is written as its
    text (``"inf"``): strict JSON has no infinity, and the credit config reads the text back."""
    return _finite_or_text(dataclasses.asdict(config))  # type: ignore[call-overload]


def _finite_or_text(value: Any) -> Any:
    """``value`` with every non-finite float inside replaced by its text (``"inf"``, ``"-inf"``, ``"nan"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite_or_text(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_finite_or_text(item) for item in value)
    return value
