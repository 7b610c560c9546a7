"""The policy's optimizer class, from a class or a plain-text path (settings stay JSON)."""

from __future__ import annotations

import importlib
import inspect

import torch as th


def resolve_optimizer_class(value: type[th.optim.Optimizer] | str) -> type[th.optim.Optimizer]:
    """An optimizer class, or its ``"module:Name"`` / ``"module.Name"`` path (plain ``policy_kwargs``,
    e.g. ``"torch.optim:SGD"``)."""
    if not isinstance(value, str):
        return value
    module, sep, name = value.partition(":") if ":" in value else value.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if sep else None
    except (ImportError, AttributeError):
        found = None
    if not (isinstance(found, type) and issubclass(found, th.optim.Optimizer)):
        raise ValueError(f"optimizer_class {value!r} names no torch optimizer; e.g. 'torch.optim:AdamW'")
    return found


def optimizer_arguments(optimizer_class: type[th.optim.Optimizer] | str) -> set[str]:
    """The keyword arguments an optimizer class (or its ``"module:Name"`` path) accepts."""
    return set(inspect.signature(resolve_optimizer_class(optimizer_class)).parameters)
