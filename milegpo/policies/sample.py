"""What a policy returns for one step: the action and what the update needs to re-score it (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ActionSample:
    """One step's action as sampled, with what is needed to re-score it in training.

    :param text: the action sent to the env (generate mode: the parsed
        ``<action>`` content, or the raw reply when unparsable).
    :param prompt_ids: the prompt tokens.
    :param action_ids: generate: the generated tokens (stop token included);
        choose: the chosen candidate's tokens.
    :param candidate_ids: choose mode: the tokens of every candidate; else None.
    :param chosen: choose mode: the index of the chosen candidate; else None.
    :param old_logprobs: float32 log-probs of the units as sampled: one per
        generated token (generate) or ``[log pi(chosen)]`` (choose).
    :param parsed: generate mode: an ``<action>`` tag was found; choose: True.
    :param raw_text: generate mode: the whole decoded reply.
    :param sampler_logprobs: generate mode with another sampler than the trainer's model
        (vLLM): the log-probs the sampler reported, when ``old_logprobs`` were recomputed.
    """

    text: str
    prompt_ids: list[int]
    action_ids: list[int]
    candidate_ids: list[list[int]] | None
    chosen: int | None
    old_logprobs: np.ndarray
    parsed: bool
    raw_text: str = ""
    sampler_logprobs: np.ndarray | None = None


class Turn(tuple[str, str]):
    """One past step of an episode as a rollout keeps it: the ``(observation, action)`` pair every history
    step is, with the step's :class:`ActionSample` beside it (None for a history written by hand).

    A chat prompt reads the sample's token ids to grow the conversation by appending the ids the policy
    sampled instead of re-tokenising its reply (:mod:`milegpo.policies.chat_turns`); everything else
    reads the pair."""

    sample: ActionSample | None

    def __new__(cls, observation: str, action: str, sample: ActionSample | None = None) -> Turn:
        turn = super().__new__(cls, (observation, action))
        turn.sample = sample
        return turn

    def __getnewargs__(self) -> tuple[str, str]:  # pickling: the pair, then the sample
        return self[0], self[1]
