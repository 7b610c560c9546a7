"""What every credit function shares: the config base class and the common diagnostics."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from milegpo.credit.norm import check_norm
from milegpo.credit.task_graph import TaskGraph, TaskGroups

C = TypeVar("C", bound="CreditConfig")


@dataclass(frozen=True)
class CreditConfig:
    """Hyperparameters common to all credit functions.

    :param norm: ``"mean_std_norm"`` (subtract the group mean, divide by the group's
        unbiased std + ``epsilon``) or ``"mean_norm"`` (subtract the mean only).
    :param epsilon: added to the std in ``"mean_std_norm"``.
    :param upstream_exact: reproduce verl-agent's conventions where ours deliberately
        differ (see :func:`milegpo.credit.norm.episode_scores`): the episode
        statistics are taken over step rows (a long trajectory weighs more), and the
        invalid-action penalty is subtracted from that step's return and from that
        row's episode score instead of being one more reward. Default False (ours).
    """

    norm: str = "mean_std_norm"
    epsilon: float = 1e-6
    upstream_exact: bool = False

    def __post_init__(self) -> None:
        check_norm(self.norm)
        if self.epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls: type[C], overrides: Mapping[str, Any]) -> C:
        """Build a config from ``{field: value}``; an unknown field raises ``ValueError`` naming the valid ones."""
        unknown = sorted(set(overrides) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"{cls.__name__} has no field(s) {unknown}; valid fields: {list(cls.field_names())}")
        return cls(**overrides)


def as_number(name: str, value: Any, expected: str) -> float:
    """``value`` as a float: a number, or text naming one (``"inf"`` from a command line, or a non-finite
    setting as a run's strict-JSON ``config.json`` writes it); ``ValueError`` in one line naming ``name``,
    the value and ``expected`` for NaN, a bool and anything else (a comparison would fail or mislead later)."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return number


def _check_range(name: str, value: float, low: float | None = None, high: float | None = None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ValueError(f"{name} must be in {bounds}, got {value}")


def check_nonnegative(config: object, names: tuple[str, ...]) -> None:
    for name in names:
        _check_range(name, getattr(config, name), 0.0)


def check_unit(config: object, names: tuple[str, ...]) -> None:
    for name in names:
        _check_range(name, getattr(config, name), 0.0, 1.0)


def sign_flip_fraction(advantages: np.ndarray, episode: np.ndarray) -> float:
    """Share of steps whose credit sign differs from their episode term's sign
    (over the steps whose episode term is non-zero; a zero advantage counts as differing)."""
    counted = np.count_nonzero(episode)
    if not counted:
        return 0.0
    episode_sign = np.sign(episode)  # counted where non-zero, without gathering those rows
    return np.count_nonzero((np.sign(advantages) != episode_sign) & (episode_sign != 0)) / counted


def common_diagnostics(graph: TaskGroups, advantages: np.ndarray, episode: np.ndarray) -> dict[str, Any]:
    """Batch sizes, advantage statistics and the sign-flip share, for every method."""
    n = len(advantages)
    return {
        "num_tasks": int(graph.num_tasks),
        "num_trajectories": int((graph.traj_task >= 0).sum()),
        "num_steps": int(n),
        "success_rate": float(graph.task_n_succ.sum() / max(graph.task_n_traj.sum(), 1)),
        "adv_mean": float(advantages.mean()) if n else 0.0,
        "adv_std": float(advantages.std()) if n else 0.0,
        "adv_abs_max": float(np.abs(advantages).max()) if n else 0.0,
        "sign_flip_frac": sign_flip_fraction(advantages, episode),
    }


def step_group_diagnostics(graph: TaskGraph) -> dict[str, Any]:
    """How many same-state step groups there are and how many steps share one."""
    sizes = np.bincount(graph.row_src, minlength=graph.num_nodes)
    used = sizes[sizes > 0]
    return {
        "num_step_groups": int(len(used)),
        "frac_steps_in_shared_groups": float((sizes[graph.row_src] > 1).mean()) if len(graph.row_src) else 0.0,
    }
