"""The training counters of a group-RL algorithm, read and restored as one unit.

SB3's learn loop reads some of them as attributes of the algorithm (``num_timesteps``,
``_n_updates``, ``_episode_num``, ``_total_timesteps``, ``_current_progress_remaining``);
the others are milegpo's (iterations, skipped optimizer steps, seconds trained in earlier
sessions). :class:`TrainingCounters` is the one place that lists them all: the algorithm
gives a checkpoint its ``training_counters()`` and a load restores them all from this one
object, so a counter cannot be saved and then forgotten at load time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class TrainingCounters:
    """Where a run stands.

    :param num_timesteps: env steps of active envs so far (all ranks).
    :param n_updates: optimizer steps applied (skipped ones not counted).
    :param iterations: completed iterations (a rollout and its update).
    :param skipped_steps: optimizer steps skipped for a non-finite loss or gradient norm.
    :param episode_num: episodes finished.
    :param total_timesteps: the env steps the current (or last) ``learn()`` call trains to.
    :param current_progress_remaining: SB3's remaining progress (1 at the start, 0 at the end).
    :param time_elapsed_s: seconds of training over all sessions of the run.
    """

    num_timesteps: int = 0
    n_updates: int = 0
    iterations: int = 0
    skipped_steps: int = 0
    episode_num: int = 0
    total_timesteps: int = 0
    current_progress_remaining: float = 1.0
    time_elapsed_s: float = 0.0

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingCounters:
        """The counters saved in a checkpoint (every field must be there)."""
        missing = [f.name for f in fields(cls) if f.name not in values]
        if missing:
            raise ValueError(f"the checkpoint's counters lack {missing}")
        return cls(**{f.name: values[f.name] for f in fields(cls)})
