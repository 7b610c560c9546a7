"""The settings of the offline tiny model (:func:`milegpo.policies.tiny_model`)."""

from __future__ import annotations

from dataclasses import dataclass

from milegpo.config.fields import check_int


@dataclass(frozen=True)
class TinyModelConfig:
    """The offline tiny model a run builds when ``policy.model`` is null (its vocabulary: the env's words).

    :param hidden_size: width.
    :param layers: transformer layers.
    :param heads: attention heads.
    """

    hidden_size: int = 32
    layers: int = 1
    heads: int = 2

    def __post_init__(self) -> None:
        for name in ("hidden_size", "layers", "heads"):
            check_int(f"run.tiny_model.{name}", getattr(self, name), 1)
