"""The text space of milegpo's envs and policies: observations and actions are strings.

Below both: an env (:class:`~milegpo.envs.core.TextEnv`) declares its spaces with it and a policy is
built or loaded with it (:meth:`~milegpo.policies.LLMPolicy.load`), without either importing the other.
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium import spaces

#: Characters :meth:`TextSpace.sample` draws from (printable ASCII). Membership is not
#: limited to them: any string is in a :class:`TextSpace`.
SAMPLE_CHARSET = string.printable


class TextSpace(spaces.Text):
    """A ``spaces.Text`` that contains any string (any characters, empty included) up to ``max_length``.

    ``gymnasium.spaces.Text`` rejects spaces, punctuation and the empty string by
    default; an action such as ``"go to countertop 1"`` must be in the space.
    ``sample()`` draws printable ASCII; a charset of all Unicode would make every
    env construction index ~12k characters (~30 ms per space).
    """

    def __init__(self, max_length: int = 100_000, seed: int | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length
