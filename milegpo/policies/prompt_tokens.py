"""Template prompts built once per state: the chat wrapping rendered once, token ids read from the
tokenizer's backend, each state's prompt ids kept, and choose mode's candidate ids kept per command.

A template prompt (:class:`~milegpo.policies.prompts.PromptBuilder`) is one user message wrapped
in the tokenizer's chat template with the generation prompt. Rendering the template runs
jinja for every prompt of every step (~50 µs, a tenth of a step of the CPU demo), although for
the usual templates the result is always ``prefix + content + suffix``.
:class:`RenderedChatTemplate` wraps a tokenizer and answers exactly that call by concatenation,
once it has checked that the template renders probe contents (edge whitespace, newlines,
quotes, braces, markup, non-ASCII) that way; a template that does anything else with the
content (trims it, branches on it) fails the check and is rendered as before.

It also tokenises a prompt text (``tokenizer(text, add_special_tokens=False)``, what the prompt
builder's token cache asks on a miss) with the fast tokenizer's Rust backend directly: the
transformers call around it (argument merging, a ``BatchEncoding``, offsets) costs ~0.3 ms
per text against the backend's ~0.05 ms. Only for a transformers fast tokenizer whose call
is transformers' own, while its backend has no truncation or padding set, and once the two
have given the same ids on probe texts; every other call goes to the tokenizer.

:class:`KeptPromptBuilder` keeps each state's prompt ids: the copies of a task and an episode
going back and forth meet the same state again and again (in the CPU demo 86 % of the prompts
were built before), and a kept prompt costs a dictionary lookup instead of formatting the
template, wrapping it and looking its text up. A state is keyed on what its prompt shows: a
template without ``{step}`` (the CPU demo's ``{task} {observation}``) shows a state alike at every
step, so it is built once, not once per step number it is met at.

:class:`CandidateTokens` keeps each command's candidate ids (its tokens and the end-of-turn
token): reading ``tokenizer.eos_token_id`` costs ~10 µs in transformers 5, at every command of
every step.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any, cast

from milegpo.policies.prompts import PromptBuilder, TokenCache

#: contents the split is checked on: a template that changes any of them is rendered every time
PROBES = ("x", "  lead and trail  ", "\nline one\n\nline two\n", "quotes ' \" {braces} {{ }} {% %} <tag> </tag>",
          "ünïcödé — ✓", "<|im_end|> <think>")
SENTINEL = "\x00milegpo-content\x00"


def _render(tokenizer: Any, content: str) -> str:
    return str(tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False))


def split_chat_template(tokenizer: Any) -> tuple[str, str] | None:
    """``(prefix, suffix)`` such that ``tokenizer``'s chat template renders one user message ``c`` with
    the generation prompt as ``prefix + c + suffix`` for every probe content, or None (no template, or one
    that does something else with the content)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        parts = _render(tokenizer, SENTINEL).split(SENTINEL)
        if len(parts) != 2:
            return None
        prefix, suffix = parts
        if any(_render(tokenizer, probe) != prefix + probe + suffix for probe in PROBES):
            return None
    except Exception:  # a template that cannot render the probes is rendered as it is, every time
        return None
    return prefix, suffix


def _backend_plain(tokenizer: Any) -> bool:
    """The backend is set as transformers' call sets it for a plain text: no truncation, no padding, special
    tokens in the text kept whole unless the tokenizer splits them."""
    backend = tokenizer._tokenizer
    return (backend.truncation is None and backend.padding is None
            and backend.encode_special_tokens == bool(tokenizer.split_special_tokens))


def fast_backend(tokenizer: Any) -> Any:
    """The Rust ``tokenizers.Tokenizer`` behind ``tokenizer`` when encoding a text with it gives the ids of
    ``tokenizer(text, add_special_tokens=False)`` (transformers' own fast tokenizer call, unchanged by the
    tokenizer's class, and equal ids on the probe texts), else None."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: always the tokenizer's own call
        return None
    cls = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend) or cls.__call__ is not PreTrainedTokenizerBase.__call__ \
            or cls._encode_plus is not TokenizersBackend._encode_plus or hasattr(tokenizer, "_switch_to_input_mode"):
        return None
    backend: Any = tokenizer._tokenizer
    try:
        for probe in (*PROBES, _render(tokenizer, "x") if getattr(tokenizer, "chat_template", None) else "y"):
            expected = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
            if not _backend_plain(tokenizer) or backend.encode(probe, add_special_tokens=False).ids != expected:
                return None
    except Exception:  # a tokenizer that cannot encode the probes is always called itself
        return None
    return backend


class RenderedChatTemplate:
    """``tokenizer`` whose ``apply_chat_template`` of one user message with the generation prompt (as text)
    is ``prefix + content + suffix`` (:func:`split_chat_template`); every other attribute and call is the
    tokenizer's own."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.split = split_chat_template(tokenizer)
        self.backend = fast_backend(tokenizer)

    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]], *args: Any, **kwargs: Any) -> Any:
        """The tokenizer's ``apply_chat_template``; concatenated for a lone user message rendered as text."""
        if (self.split is not None and not args and kwargs == {"add_generation_prompt": True, "tokenize": False}
                and len(conversation) == 1 and set(conversation[0]) == {"role", "content"}
                and conversation[0]["role"] == "user" and isinstance(conversation[0]["content"], str)):
            return self.split[0] + conversation[0]["content"] + self.split[1]
        return self.tokenizer.apply_chat_template(conversation, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The tokenizer's call; a lone text without special tokens from the backend (see the module docstring)."""
        if (self.backend is not None and len(args) == 1 and isinstance(args[0], str)
                and kwargs == {"add_special_tokens": False} and _backend_plain(self.tokenizer)):
            return {"input_ids": self.backend.encode(args[0], add_special_tokens=False).ids}
        return self.tokenizer(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.tokenizer)

    def __getattr__(self, name: str) -> Any:
        if name in ("tokenizer", "split", "backend") or name.startswith("__"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.tokenizer, name)


class CandidateTokens:
    """A command's candidate ids in choose mode: its tokens (no special tokens) followed by the tokenizer's
    end-of-turn token, when it has one; kept per command (at most ``max_entries``, the oldest half dropped
    when full). Callers get a fresh list each time."""

    def __init__(self, tokenizer: Any, max_entries: int = 65536):
        self.tokenizer, self.max_entries = tokenizer, int(max_entries)
        self._tokens = TokenCache(cast(Any, RenderedChatTemplate(tokenizer)))
        self._ids: dict[str, tuple[int, ...]] = {}

    def __call__(self, command: str) -> list[int]:
        ids = self._ids.get(command)
        if ids is None:
            if len(self._ids) >= self.max_entries:
                for key in list(self._ids)[: self.max_entries // 2]:
                    del self._ids[key]
            eos = self.tokenizer.eos_token_id
            ids = self._ids[command] = (*self._tokens(command), *(() if eos is None else (int(eos),)))
        return list(ids)

    def many(self, commands: Sequence[str]) -> list[list[int]]:
        """Each command's candidate ids, as one call per command gives them (a step's commands are looked up in
        one loop: they are nearly always kept already)."""
        kept = self._ids
        return [list(ids) if (ids := kept.get(command)) is not None else self(command) for command in commands]


class KeptPromptBuilder(PromptBuilder):
    """:class:`~milegpo.policies.prompts.PromptBuilder` on a :class:`RenderedChatTemplate` of the tokenizer,
    whose :meth:`build` keeps each state's prompt ids (at most ``max_entries``, the oldest half dropped when
    full): a state is what the prompt shows of it, of the task, the observation, the commands, the step
    number and the last ``history_length`` steps those the template shows, so a kept prompt is the one the
    builder would build again."""

    def __init__(self, tokenizer: Any, prompt_template: str | None, instructions: str, history_length: int,
                 max_prompt_tokens: int, max_entries: int = 65536):
        super().__init__(RenderedChatTemplate(tokenizer), prompt_template, instructions, history_length,
                         max_prompt_tokens)
        self.max_entries = int(max_entries)
        self._kept: dict[tuple, tuple[int, ...]] = {}
        shown = {name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None}
        self._shows_task = "task" in shown
        self._shows_commands = "admissible_commands" in shown
        self._shows_history = "history" in shown and self.history_length > 0
        # the step number is shown by {step}, and by the numbered steps of a shown history
        self._shows_step = "step" in shown or self._shows_history

    def build(self, task: str, observation: str, history: Sequence[tuple[str, str]],
              commands: Sequence[str] | None) -> list[int]:
        """Prompt token ids within ``max_prompt_tokens`` (see :meth:`PromptBuilder.build`)."""
        shown = tuple(tuple(step) for step in history[len(history) - self.history_length:]) \
            if self._shows_history and history else ()
        key = (task if self._shows_task else "", observation,
               (tuple(commands) if commands else ()) if self._shows_commands else (),
               len(history) if self._shows_step else 0, shown)
        ids = self._kept.get(key)
        if ids is None:
            if len(self._kept) >= self.max_entries:
                for old in list(self._kept)[: self.max_entries // 2]:
                    del self._kept[old]
            ids = self._kept[key] = tuple(super().build(task, observation, history, commands))
        return list(ids)
