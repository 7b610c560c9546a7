"""A request of an agent program during training, checked as ``milegpo serve`` checks one, with the
differences training makes.

While training, the policy samples as the trainer configured it: every reply is drawn from
``softmax(logits / policy.temperature)`` with ``policy.max_new_tokens`` at most, because the update
needs the exact distribution the tokens were drawn from. So the sampling fields of a request
(``temperature``, ``top_p``, ``seed``, ``max_tokens``, ``max_completion_tokens``) are set aside, and the
first request in a process that gives one says so in one line per field. What cannot be set aside
without changing what the program reads is refused with a 400 naming it: ``n`` other than 1 (each
completion is one step of one episode; the group's K episodes are the trainer's), ``stop``
(cutting a reply would leave the trainer scoring tokens the program never saw) and ``logprobs``.
``model`` may name anything: every request of a session is answered by the policy being trained,
so a program written for another model runs unchanged. The rest is serve's checking
(:func:`milegpo.serve.request.parse_chat_request`): messages, tools, ``tool_choice``, ``stream``.
"""

from __future__ import annotations

import logging
from typing import Any

from milegpo.serve.errors import APIError
from milegpo.serve.request import ChatRequest, parse_chat_request

logger = logging.getLogger("milegpo.agents")

#: the name the models route lists (a request may name any model: the policy answers)
MODEL_NAME = "milegpo-policy"
#: the request fields that the trainer's sampling settings replace
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "max_tokens", "max_completion_tokens")
_noticed: set[str] = set()


def check_request(body: Any) -> ChatRequest:
    """The checked request of a JSON body (``APIError`` 400 naming what is refused; see the module docstring)."""
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    if body.get("n") not in (None, 1):
        raise APIError(f"n={body['n']!r}: while training each completion is one step of one episode, so n must be 1 "
                       "(the trainer plays the K episodes of a group itself)", param="n")
    if body.get("stop"):
        raise APIError("stop is not supported while training: the trainer scores every token the policy generated, "
                       "so a reply is never cut; leave stop out", param="stop")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise APIError("logprobs are not returned while training (the trainer keeps the sampled tokens and their "
                       "log-probs itself); leave logprobs out", param="logprobs")
    for name in SAMPLING_FIELDS:
        if body.get(name) is not None and name not in _noticed:
            _noticed.add(name)
            logger.warning("an agent program's request sets %s=%r: while training the policy samples with its own "
                           "settings (policy.temperature, policy.max_new_tokens, the trainer's seeds), so %s is set "
                           "aside (said once)", name, body[name], name)
    kept = {key: value for key, value in body.items() if key not in SAMPLING_FIELDS}
    model = kept.get("model")
    if not isinstance(model, str) or not model:
        raise APIError("model is missing: give the model name your program uses (any name: the policy being "
                       "trained answers)", param="model")
    return parse_chat_request(kept, model, 1.0, native_tools=False)
