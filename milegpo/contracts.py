"""The contracts between milegpo's rooms, as types: what a policy offers the trainer.

The rollout loop, the evaluation, the update and the warm start need only these methods
of a policy; :class:`~milegpo.policies.LLMPolicy` provides them, and so can a policy of
one's own (``MileGPO(MyPolicy, env)``). Torch-free at import (types only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch as th

    from milegpo.policies.sample import ActionSample

#: past (observation, action) steps of one episode, oldest first; rollouts pass each step as a
#: :class:`~milegpo.policies.sample.Turn`, the pair with the step's sample (a chat prompt appends its ids)
History = Sequence[tuple[str, str]]


class ActingPolicy(Protocol):
    """A policy that acts on text: what rollouts and evaluations need."""

    #: the sampling temperature of :meth:`act` (an evaluation may set another for its episodes)
    temperature: float

    def act(self, observations: Sequence[str], infos: Sequence[Mapping[str, object]],
            histories: Sequence[History], deterministic: bool = False,
            sample_seeds: Sequence[int] | None = None) -> list[ActionSample]:
        """One action per env, with what the update needs to score it again (``sample_seeds``: one per
        env, so that an env's sample does not depend on the other envs of the call)."""
        ...

    def set_training_mode(self, mode: bool) -> None:
        """Dropout on (training) or off (acting)."""
        ...

    def history_text(self, sample: ActionSample) -> str:
        """What an episode's history keeps of a step's action (the action, or the whole reply)."""
        ...

    def seeded_sampling(self, seed: int) -> AbstractContextManager[None]:
        """Sample from ``seed`` inside the context; the policy's own generators continue afterwards."""
        ...


class TrainablePolicy(ActingPolicy, Protocol):
    """An acting policy that can be updated: what the PPO-clip update and the warm start need."""

    def evaluate_actions(self, samples: Sequence[ActionSample], with_entropy: bool = False,
                         use_reference: bool = False) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """Per-unit ``(log-probs, mask, entropy)`` of ``samples`` now (or under the reference model)."""
        ...

    def trainable_parameters(self) -> list[th.nn.Parameter]:
        """The parameters the optimizer updates (the LoRA adapter)."""
        ...

    def demonstration(self, observation: str, info: Mapping[str, object], history: History,
                      action: str) -> ActionSample:
        """``action`` taken in this state, as a sample the policy can be trained to imitate."""
        ...
