"""The policy's optimizer class, from a class or a plain-text path (settings stay JSON)."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

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


def with_default_weight_decay(optimizer_class: type[th.optim.Optimizer] | str, optimizer_kwargs: dict[str, Any] | None,
                              weight_decay: float) -> dict[str, Any]:
    """``optimizer_kwargs`` with ``weight_decay`` added unless they set it or the optimizer takes none
    (the algorithm's weight decay is a default; the optimizer settings a user gives win)."""
    kwargs = dict(optimizer_kwargs or {})
    if "weight_decay" in inspect.signature(resolve_optimizer_class(optimizer_class)).parameters:
        kwargs.setdefault("weight_decay", weight_decay)
    return kwargs
