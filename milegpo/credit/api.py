"""The entry points the trainer uses: one function per method name, configs by name."""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from milegpo.credit.base import CreditConfig, as_number
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.g2po import G2POConfig, g2po
from milegpo.credit.gagpo import GAGPOConfig, gagpo
from milegpo.credit.gigpo import GiGPOConfig, gigpo
from milegpo.credit.graphgpo import GraphGPOConfig, graphgpo
from milegpo.credit.grpo import GRPOConfig, grpo
from milegpo.credit.hgpo import HGPOConfig, hgpo
from milegpo.credit.milegpo import MileGPOConfig, milegpo
from milegpo.credit.rloo import RLOOConfig, rloo

_REGISTRY: dict[str, tuple[Callable[..., CreditResult], type[CreditConfig]]] = {
    "grpo": (grpo, GRPOConfig),
    "rloo": (rloo, RLOOConfig),
    "gigpo": (gigpo, GiGPOConfig),
    "hgpo": (hgpo, HGPOConfig),
    "graphgpo": (graphgpo, GraphGPOConfig),
    "milegpo": (milegpo, MileGPOConfig),
    "gagpo": (gagpo, GAGPOConfig),
    "g2po": (g2po, G2POConfig),
}

CREDIT_METHODS: tuple[str, ...] = tuple(_REGISTRY)
"""The names :func:`compute_credit` accepts."""


def _lookup(method: str) -> tuple[Callable[..., CreditResult], type[CreditConfig]]:
    try:
        return _REGISTRY[method]
    except KeyError:
        raise ValueError(f"unknown credit method {method!r}; choose one of {CREDIT_METHODS}") from None


def make_credit_config(method: str, **overrides: Any) -> CreditConfig:
    """The config of ``method`` with ``overrides`` applied.

    For ``"milegpo"`` the key ``preset`` (``"alfworld"`` / ``"webshop"``) starts from
    that env's setting. An unknown key raises ``ValueError`` naming the valid fields, and so does a value
    not of its field's type (:func:`typed_overrides`).
    """
    _, config_cls = _lookup(method)
    preset = overrides.pop("preset", None)
    overrides = typed_overrides(config_cls, overrides)
    if preset is not None:
        if config_cls is not MileGPOConfig:
            raise ValueError(f"presets exist for 'milegpo' only, not {method!r}")
        return MileGPOConfig.preset(preset, **overrides)
    return config_cls.from_dict(overrides)


def typed_overrides(config_cls: type[CreditConfig], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` of ``config_cls``'s fields, each value checked against its field's type and given as it:
    a number field takes a number or text naming one (``"inf"``, as a command line or a strict-JSON
    ``config.json`` gives it; :func:`~milegpo.credit.base.as_number`), an integer field an integer, a flag
    true or false, a text field text, and an optional field null too. Anything else (``omega="abc"``, a list,
    ``rcs=1``) raises ``ValueError`` in one line naming the field, the value and what it takes, where the
    config's own checks would fail with a ``TypeError`` or take it as something else (a non-empty text is a
    true flag). Unknown fields are left to :meth:`CreditConfig.from_dict`, which names the valid ones."""
    hints = typing.get_type_hints(config_cls)
    return {name: _as_field_type(name, value, hints[name]) if name in hints else value
            for name, value in overrides.items()}


def _as_field_type(name: str, value: Any, annotation: Any) -> Any:
    """``value`` as the type ``annotation`` names (``X`` or ``X | None``); ``ValueError`` if it is not one."""
    kinds = [kind for kind in typing.get_args(annotation) or (annotation,) if kind is not type(None)]
    optional = len(kinds) < len(typing.get_args(annotation))
    if optional and value is None:
        return None
    kind, null = kinds[0], " or null" if optional else ""
    if kind is float:
        return as_number(name, value, f"a number{null}")
    if kind is bool and isinstance(value, (bool, np.bool_)):
        return bool(value)
    if kind is int and isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if kind is str and isinstance(value, str):
        return value
    expected = {bool: "true or false", int: "an integer", str: "text"}[kind]
    raise ValueError(f"{name} must be {expected}{null}, got {value!r}")


def compute_credit(method: str, batch: StepBatch,
                   config: CreditConfig | Mapping[str, Any] | None = None) -> CreditResult:
    """Step advantages of ``batch`` (one per row, in row order) under ``method``.

    :param method: one of :data:`CREDIT_METHODS`.
    :param batch: the steps of grouped rollouts.
    :param config: the method's config object, a dict of overrides of its defaults
        (see :func:`make_credit_config`), or None for the defaults.
    """
    fn, config_cls = _lookup(method)
    if config is None or isinstance(config, Mapping):
        config = make_credit_config(method, **dict(config or {}))
    elif not isinstance(config, config_cls):
        raise TypeError(f"credit method {method!r} takes a {config_cls.__name__}, got {type(config).__name__}")
    if batch.num_steps == 0:
        return empty_credit(method)
    check_finite_batch(batch)
    return checked_advantages(method, config, fn(batch, config))


def empty_credit(method: str) -> CreditResult:
    """The credit of a batch without steps (every credit path returns it)."""
    return CreditResult(advantages=np.zeros(0), diagnostics={"method": method, "num_steps": 0})


def check_finite_batch(batch: StepBatch) -> None:
    """Refuse a batch with a non-finite reward or outcome: every credit path checks it before crediting
    (:func:`compute_credit`, the milestone memory's :func:`milegpo.credit.memory.remembered_credit`)."""
    if not (np.all(np.isfinite(batch.rewards)) and np.all(np.isfinite(batch.outcomes))):
        raise ValueError("the StepBatch holds a non-finite reward or outcome: credit would be NaN")


def checked_advantages(method: str, config: CreditConfig, result: CreditResult) -> CreditResult:
    """``result``, once its advantages are all finite; ``ValueError`` naming the likely cause otherwise (every
    credit path checks it, so a NaN never reaches the update as a generic non-finite loss)."""
    if not np.all(np.isfinite(result.advantages)):
        raise ValueError(f"{method} credit gave non-finite advantages under {config}: a normalisation divided by "
                         "zero (epsilon=0 with a group whose values are all equal?)")
    return result


def credit_of_trajectory(batch: StepBatch, traj_id: int, methods: Iterable[str] = CREDIT_METHODS,
                         configs: Mapping[str, CreditConfig | Mapping[str, Any]] | None = None
                         ) -> dict[str, np.ndarray]:
    """Per-step credit of trajectory ``traj_id`` under each method, in step order (for plots).

    :param configs: optional config (or overrides) per method name.
    """
    rows = np.flatnonzero(batch.traj_ids == traj_id)
    if len(rows) == 0:
        raise ValueError(f"trajectory {traj_id} has no steps in the batch")
    rows = rows[np.argsort(batch.step_idx[rows], kind="stable")]
    configs = configs or {}
    return {m: compute_credit(m, batch, configs.get(m)).advantages[rows] for m in methods}
