"""The supervised warm start's settings (:func:`milegpo.algos.warm_start.warm_start`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from milegpo.config.fields import check_int, check_number, check_type


@dataclass(frozen=True)
class WarmStartConfig:
    """How the warm start collects demonstrations and fine-tunes on them.

    :param episodes: demonstration episodes (training tasks ``0..episodes-1``).
    :param epsilon: per-step probability of a random admissible command instead of the expert's.
    :param epochs: passes over the demonstrations.
    :param learning_rate: AdamW learning rate of the fine-tuning (its own optimizer: RL's is untouched).
    :param batch_size: demonstration steps per optimizer step.
    :param env_kwargs: extra kwargs of the demonstration envs (e.g. ALFWorld's
        ``{expert_type: handcoded}``, which the RL envs do not need).
    :param seed: seed of the noise and of the minibatch order (null: the run's seed).
    """

    episodes: int = 64
    epsilon: float = 0.3
    epochs: int = 3
    learning_rate: float = 3e-3
    batch_size: int = 64
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("episodes", "epochs", "batch_size"):
            check_int(f"warm_start.{name}", getattr(self, name), 1)
        check_number("warm_start.epsilon", self.epsilon, positive=False)
        if self.epsilon > 1:
            raise ValueError(f"warm_start.epsilon must be a number in [0, 1], got {self.epsilon!r}")
        check_number("warm_start.learning_rate", self.learning_rate)
        check_int("warm_start.seed", self.seed, 0, optional=True)
        check_type("warm_start.env_kwargs", self.env_kwargs, dict, "a mapping")
