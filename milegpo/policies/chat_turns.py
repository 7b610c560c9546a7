"""Chat prompts grown by appending token ids (token in, token out).

Rendering a conversation as text and tokenising it again at every turn gives the model the
*re-tokenised* text of its earlier replies, not the ids it sampled: with a tokenizer that does not
round-trip a reply (a word-level tokenizer meeting an unknown word, a BPE merge across the reply's
end, a template that trims the reply), turn ``t + 1``'s prompt no longer starts with turn ``t``'s
prompt and reply. The update then scores a context the sampler never produced, and the one-pass
scoring of a conversation (:mod:`milegpo.policies.conversation`) finds nothing to share.

Here a turn's prompt is built from ids only: the opening messages rendered once, then per past
turn the reply's sampled ids and the ids the chat template puts after a reply: its end of turn,
the next observation's message and the next generation prompt (:meth:`TurnIds.after`). So turn
``t + 1``'s prompt is turn ``t``'s prompt + its sampled reply + those ids, whatever the tokenizer.
A reply that ends with the stop token the template closes a turn with is not closed twice; a reply
cut at ``max_new_tokens`` gets the template's end of turn.

This holds only for a template that renders a conversation turn by turn: what follows a reply
must not depend on the earlier turns, and an earlier turn must not change when a new one is added.
:class:`TurnIds` checks it on probe conversations once per tool set, and answers None when the
template does anything else (a system prompt moved into the last user message, say); the prompt
builder then renders the conversation as text, as for a history without sampled ids.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from milegpo.policies.tools import render_chat

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: stands for a reply's content in the probe renders: reasoning, then an answer (a template that drops the
#: reasoning of earlier replies, as Qwen3's does, changes it and is rendered as text)
PROBE_REPLY = "<think>\x00milegpo-reasoning\x00</think>\n\n\x00milegpo-reply\x00"
#: conversations before the probed turn: what follows a reply must be the same after each of them, and after
#: an earlier turn ending in each role the probe uses (:func:`probe_openings`)
PROBE_OPENINGS: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "x"},),
    ({"role": "system", "content": "s"}, {"role": "user", "content": "y z"}),
)
#: the observations the probes follow the reply with
PROBE_CONTENTS = ("o", "  two lines\nof text  ", "ünï <tag> {x}")
#: the most message lists whose ids are kept (all dropped when full)
MAX_KEPT = 65536

Messages = Sequence[Mapping[str, Any]]


def probe_openings(roles: Sequence[str]) -> list[tuple[dict[str, str], ...]]:
    """:data:`PROBE_OPENINGS` and, per role in ``roles``, an earlier turn whose reply that role answered (a
    template that keeps state across messages of a role, such as DeepSeek-V3's tool outputs, then shows it)."""
    earlier = [({"role": "user", "content": "x"}, {"role": "assistant", "content": "r"}, {"role": role, "content": "w"})
               for role in dict.fromkeys(["user", *roles])]
    return [*PROBE_OPENINGS, *earlier]


class TurnIds:
    """The ids a chat template puts after a reply, for a given next message (see the module docstring).

    :param tokenizer: a ``transformers`` tokenizer with a chat template.
    :param stop_ids: the tokens that end a sampled reply (the policy's end-of-turn ids).
    :param tokens: a text's ids as the template's tokenisation gives them (``tokenizer(text,
        add_special_tokens=False)``, cached by the caller).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_ids: Sequence[int], tokens: Callable[[str], list[int]]):
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self._tokens = tokens
        self._turn_by_turn: dict[str, bool] = {}  # per tool set: whether the template renders turn by turn
        self._warned = False
        self._after: dict[str, tuple[int, ...] | None] = {}  # per (messages, tools)

    def _after_text(self, opening: Messages, messages: Messages,
                    tools: Sequence[Mapping[str, Any]] | None) -> str | None:
        """The text the template puts between a reply to ``opening`` and the generation prompt after the
        ``messages`` that follow it, or None when the render does not start with the opening's own render
        and the reply."""
        head = str(render_chat(self.tokenizer, opening, tools, tokenize=False)) + PROBE_REPLY
        reply = {"role": "assistant", "content": PROBE_REPLY}
        full = str(render_chat(self.tokenizer, [*opening, reply, *messages], tools, tokenize=False))
        return full[len(head):] if full.startswith(head) and full.count(PROBE_REPLY) == 1 else None

    def turn_by_turn(self, tools: Sequence[Mapping[str, Any]] | None, roles: Sequence[str]) -> bool:
        """Whether the template renders a conversation turn by turn (with these tools, a reply followed by
        messages in ``roles``): on every probe, what follows a reply is the same after each probe opening."""
        key = json.dumps([tools or [], list(roles)], sort_keys=True, default=str)
        known = self._turn_by_turn.get(key)
        if known is None:
            try:
                afters = [{self._after_text(opening, [{"role": role, "content": content} for role in roles], tools)
                           for opening in probe_openings(roles)} for content in PROBE_CONTENTS]
                known = all(len(texts) == 1 and None not in texts for texts in afters)
            except Exception:  # a template that cannot render the probes (roles it refuses): rendered as text
                known = False
            self._turn_by_turn[key] = known
            if not known and not self._warned:
                warnings.warn("the chat template does not render a conversation turn by turn (what follows a reply "
                              "depends on the earlier turns, or an earlier turn changes when one is added): its "
                              "prompts are rendered from the conversation's text, so earlier replies reach the model "
                              "re-tokenised and each turn is scored on its own", stacklevel=4)
                self._warned = True
        return known

    def after(self, reply_ids: Sequence[int], messages: Messages,
              tools: Sequence[Mapping[str, Any]] | None) -> list[int] | None:
        """The ids that follow the sampled ``reply_ids`` when ``messages`` come next: the template's end of
        turn (left out when the reply already ends with that stop token), the messages and the next
        generation prompt; None when the template does not render turn by turn."""
        if not messages or not self.turn_by_turn(tools, [str(m.get("role")) for m in messages]):
            return None
        key = json.dumps([list(messages), tools or []], sort_keys=True, default=str)
        if key not in self._after:
            if len(self._after) >= MAX_KEPT:
                self._after.clear()
            text = self._after_text(PROBE_OPENINGS[0], messages, tools)
            self._after[key] = None if text is None else tuple(self._tokens(text))
        ids = self._after[key]
        if ids is None:
            return None
        if ids and reply_ids and int(reply_ids[-1]) == ids[0] and ids[0] in self.stop_ids:
            return list(ids[1:])  # the reply's stop token is the template's end of turn
        return list(ids)
