"""Prompt building: task + bounded history + current observation + admissible commands.

A prompt template is a ``str.format`` string with these named fields (any subset):

``{task}``                 the goal text of the episode (``info["task"]``)
``{history}``              the last K (observation, action) steps, oldest first, or ""
``{step}``                 the number of the current step (1-based)
``{observation}``          the current observation
``{admissible_commands}``  the admissible commands, quoted and comma-separated
``{instructions}``         how to answer (depends on the mode and on ``think``)

Templates are registered per env family in :data:`PROMPT_TEMPLATES` (``default``,
``alfworld``, ``webshop``); :class:`PromptBuilder` takes a registry key or a
template string of one's own. The text is wrapped in the tokenizer's chat template
when it has one. When the prompt exceeds ``max_prompt_tokens`` the oldest history
steps are dropped first; only if the prompt without history is still too long is
the middle of the current observation cut, with a warning (once per builder).
"""

from __future__ import annotations

import json
import string
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from milegpo.policies.chat_turns import TurnIds
from milegpo.policies.tools import render_chat

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Prompt templates keyed by env family.
PROMPT_TEMPLATES: dict[str, str] = {
    "default": (
        "You are an agent acting in a text environment.\n"
        "Your task: {task}\n"
        "{history}"
        "Step {step} observation: {observation}\n"
        "Admissible actions: {admissible_commands}\n"
        "{instructions}"
    ),
    "alfworld": (
        "You are an expert household agent in the ALFRED text world.\n"
        "Your task is to: {task}\n"
        "{history}"
        "Step {step}. Your current observation is: {observation}\n"
        "Your admissible actions now are: [{admissible_commands}].\n"
        "{instructions}"
    ),
    "webshop": (
        "You are an expert shopping agent on the WebShop web site.\n"
        "Your task is to: {task}\n"
        "{history}"
        "Step {step}. Your current observation is: {observation}\n"
        "Your admissible actions now are: [{admissible_commands}].\n"
        "{instructions}"
    ),
}

FIELDS = frozenset({"task", "history", "step", "observation", "admissible_commands", "instructions"})

HISTORY_HEADER = "Your previous steps, oldest first:\n"
HISTORY_STEP = "Step {n} observation: {observation}\nStep {n} action: {action}\n"
ANY_COMMAND = "any text command"

INSTRUCTIONS = {
    "choose": "Answer with one of the admissible actions.",
    "generate": "Choose one admissible action and answer with it inside <action> </action> tags.",
    "think": (
        "First think step by step inside <think> </think> tags, then answer with one admissible action "
        "inside <action> </action> tags."
    ),
}

#: what the first user message of a tool-calling env (``action_format="tools"``) asks instead of the tag
#: instructions: its reply is read as tool calls, in the format the chat template's tool turn gives
TOOL_INSTRUCTIONS = {
    INSTRUCTIONS["generate"]: "Answer by calling one of the tools.",
    INSTRUCTIONS["think"]: "First think step by step inside <think> </think> tags, then answer by calling one of the "
                           "tools.",
}


def template_vocabulary() -> list[str]:
    """Every fixed text the prompts can contain (so a tiny tokenizer covers it)."""
    return [*PROMPT_TEMPLATES.values(), HISTORY_HEADER, HISTORY_STEP, ANY_COMMAND, *INSTRUCTIONS.values()]


def resolve_template(prompt_template: str | None) -> str:
    """A registry key (or None = ``"default"``) -> its template; any other string is the template itself."""
    if prompt_template is None:
        return PROMPT_TEMPLATES["default"]
    if prompt_template in PROMPT_TEMPLATES:
        return PROMPT_TEMPLATES[prompt_template]
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(prompt_template) if name is not None}
    except ValueError as err:
        raise ValueError(f"prompt_template is not a valid format string: {err}") from None
    unknown = used - FIELDS
    if unknown:
        raise ValueError(
            f"prompt_template uses unknown fields {sorted(unknown)}; allowed: {sorted(FIELDS)} "
            f"(or pass a registered family: {sorted(PROMPT_TEMPLATES)})"
        )
    if "observation" not in used:
        raise ValueError("prompt_template must contain the {observation} field")
    return prompt_template


def format_history(history: Sequence[tuple[str, str]], first_step: int) -> str:
    """The history block; ``first_step`` is the step number of ``history[0]``."""
    if not history:
        return ""
    steps = "".join(
        HISTORY_STEP.format(n=first_step + i, observation=obs.strip(), action=act.strip())
        for i, (obs, act) in enumerate(history)
    )
    return HISTORY_HEADER + steps


def format_commands(commands: Sequence[str] | None) -> str:
    if not commands:
        return ANY_COMMAND
    return ", ".join(f"'{c}'" for c in commands)


class PromptBuilder:
    """Turns (task, observation, history, commands) into prompt token ids.

    :param tokenizer: a ``transformers`` tokenizer (its chat template is used when it has one).
    :param prompt_template: a key of :data:`PROMPT_TEMPLATES` or a template string.
    :param instructions: the answer instructions (see :data:`INSTRUCTIONS`).
    :param history_length: how many of the last steps to show (K).
    :param max_prompt_tokens: the prompt budget in tokens.
    """

    def __init__(self, tokenizer, prompt_template: str | None, instructions: str, history_length: int,
                 max_prompt_tokens: int):
        if history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {history_length}")
        if max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
        self.tokenizer = tokenizer
        self.template = resolve_template(prompt_template)
        self.instructions = instructions
        self.history_length = history_length
        self.max_prompt_tokens = max_prompt_tokens
        self._warned = False
        self._encoded = TokenCache(tokenizer)

    def text(self, task: str, observation: str, history: Sequence[tuple[str, str]], commands: Sequence[str] | None,
             k: int) -> str:
        """The prompt text (chat template applied) showing the last ``k`` history steps."""
        shown = list(history)[-k:] if k > 0 else []
        content = self.template.format(
            task=task.strip(),
            history=format_history(shown, first_step=len(history) - len(shown) + 1),
            step=len(history) + 1,
            observation=observation.strip(),
            admissible_commands=format_commands(commands),
            instructions=self.instructions,
        )
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
            )
        return content + "\n"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (cached: the same prompt recurs across a group and across steps)."""
        return self._encoded(text)

    def build(self, task: str, observation: str, history: Sequence[tuple[str, str]],
              commands: Sequence[str] | None) -> list[int]:
        """Prompt token ids within ``max_prompt_tokens`` (see the module docstring)."""
        for k in range(min(self.history_length, len(history)), -1, -1):
            ids = self.encode(self.text(task, observation, history, commands, k))
            if len(ids) <= self.max_prompt_tokens:
                return ids
        # Even without history the prompt is too long: cut the middle of the observation.
        if not self._warned:
            warnings.warn(
                f"a prompt exceeds max_prompt_tokens={self.max_prompt_tokens} even without history; the middle of "
                "the current observation is cut to fit (raise max_prompt_tokens to keep it whole)",
                stacklevel=3,
            )
            self._warned = True
        keep = len(observation)
        while keep > 0:
            keep = int(keep * min(0.9, self.max_prompt_tokens / len(ids)))
            cut = _cut_middle(observation, keep)
            ids = self.encode(self.text(task, cut, history, commands, 0))
            if len(ids) <= self.max_prompt_tokens:
                return ids
        raise ValueError(
            f"the prompt does not fit max_prompt_tokens={self.max_prompt_tokens} even with an empty observation "
            f"({len(ids)} tokens): raise max_prompt_tokens or shorten the template/task/admissible commands"
        )


def _cut_middle(text: str, keep: int) -> str:
    """``text`` reduced to about ``keep`` characters: its start and its end, cut at spaces, joined by " ... "."""
    if keep <= 0:
        return "..."
    head, tail = text[: keep // 2], text[len(text) - keep // 2 :]
    head = head.rsplit(" ", 1)[0] if " " in head else head
    tail = tail.split(" ", 1)[-1] if " " in tail else tail
    return f"{head} ... {tail}"


class TokenCache:
    """``tokenizer(text)["input_ids"]`` (no special tokens), remembered per text.

    The K copies of a task start from the same state and often revisit the same states,
    so the same prompt and the same admissible commands are tokenised again and again;
    tokenising is deterministic, so the ids are kept. At most ``max_entries`` texts are
    kept (the oldest half is dropped when it is full). Callers get a fresh list each time.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_entries: int = 65536):
        self.tokenizer, self.max_entries = tokenizer, int(max_entries)
        self._ids: dict[str, tuple[int, ...]] = {}

    def __call__(self, text: str) -> list[int]:
        ids = self._ids.get(text)
        if ids is None:
            if len(self._ids) >= self.max_entries:
                for key in list(self._ids)[: self.max_entries // 2]:
                    del self._ids[key]
            ids = self._ids[text] = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(ids)


class ChatPromptBuilder:
    """Turns an episode into one conversation and that into prompt token ids (``prompt_format="chat"``).

    The messages are the env's opening ``messages`` as given (a dataset's system and user prompt),
    or else one user message with the task, the first observation and ``instructions``; then, per
    past step, the model's whole reply as an ``assistant`` turn and the observation that followed
    as a ``user`` (or the env's ``observation_role``, e.g. ``tool``) turn. The tokenizer's chat
    template renders them, with the generation prompt of the next assistant turn.

    :param tokenizer: a ``transformers`` tokenizer with a chat template.
    :param instructions: how to answer, added to the first user message when the env gave no
        opening messages (an env with its own prompt keeps its own instructions); for a tool-calling env
        its :data:`TOOL_INSTRUCTIONS` counterpart, which asks for a tool call instead of ``<action>`` tags.
    :param history_length: the past turns shown (older ones are dropped first, the opening stays).
    :param max_prompt_tokens: the prompt budget in tokens (fewer turns are shown to fit it).
    :param stop_ids: the tokens that end a sampled reply. A history of :class:`~milegpo.policies.sample.Turn`
        steps (what rollouts keep) is then rendered from ids: the opening's ids, then per shown turn the
        reply's sampled ids and what the template puts after them (:mod:`milegpo.policies.chat_turns`), so
        each turn's prompt extends the previous turn's prompt and reply exactly. None: always rendered as text.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, instructions: str, history_length: int,
                 max_prompt_tokens: int, stop_ids: Sequence[int] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("prompt_format 'chat' needs a tokenizer with a chat template; this one has none "
                             "(use an instruct/chat model, or prompt_format 'template')")
        self.tokenizer = tokenizer
        self.instructions = instructions
        self.history_length = history_length
        self.max_prompt_tokens = max_prompt_tokens
        self.turn_ids = TurnIds(tokenizer, stop_ids, TokenCache(tokenizer)) if stop_ids is not None else None
        self._openings: dict[str, tuple[int, ...]] = {}
        self._warned = False

    def messages(self, task: str, observation: str, history: Sequence[tuple[str, str]],
                 info: Mapping[str, Any], k: int | None = None) -> list[dict[str, str]]:
        """The conversation at this step, showing the last ``k`` past turns (default: ``history_length``).

        ``history`` holds, per past step, the observation the model saw and its whole reply;
        ``observation`` is the current one; ``info`` the current step's info (opening
        ``messages``, ``observation_role``).
        """
        k = self.history_length if k is None else k
        conversation = self.opening(task, observation, history, info, k)
        role = str(info.get("observation_role", "user"))
        for (_, reply), after in _shown_turns(observation, history, k):
            conversation += [{"role": "assistant", "content": reply}, {"role": role, "content": after}]
        return conversation

    def opening(self, task: str, observation: str, history: Sequence[tuple[str, str]], info: Mapping[str, Any],
                k: int) -> list[dict[str, str]]:
        """The messages before the first shown reply: the env's opening ``messages``, or one user message with
        the task, the first observation and the instructions. When no past turn is shown (``k = 0``) after the
        first step, the current observation stands where the first one stood (the env's opening is followed by
        it as an observation message), so the model always sees where it is now."""
        opening = info.get("messages")
        current_only = bool(history) and k <= 0
        if opening:
            role = str(info.get("observation_role", "user"))
            return [dict(m) for m in opening] + ([{"role": role, "content": observation}] if current_only else [])
        first = observation if current_only or not history else history[0][0]
        content = f"Your task: {task.strip()}\n{first.strip()}" if task.strip() else first.strip()
        instructions = self.instructions
        if info.get("action_format") == "tools":  # a call, not <action> tags: one format asked for
            instructions = TOOL_INSTRUCTIONS.get(instructions, instructions)
        return [{"role": "user", "content": f"{content}\n{instructions}".strip()}]

    def build(self, task: str, observation: str, history: Sequence[tuple[str, str]],
              info: Mapping[str, Any]) -> list[int]:
        """Prompt token ids within ``max_prompt_tokens``: the most recent turns that fit (with the env's
        ``info["tools"]``, a tool-calling env's function schemas, rendered by the chat template)."""
        tools = info.get("tools") or None
        for k in range(min(self.history_length, len(history)), -1, -1):
            ids = self.appended(task, observation, history, info, k) or \
                self.encode(self.messages(task, observation, history, info, k), tools)
            if len(ids) <= self.max_prompt_tokens:
                if k == 0 and history and self.history_length and not self._warned:
                    warnings.warn(f"a chat prompt exceeds max_prompt_tokens={self.max_prompt_tokens} with even its "
                                  "last past turn: it shows the opening and the current observation only (raise "
                                  "max_prompt_tokens to keep past turns)", stacklevel=3)
                    self._warned = True
                return ids
        raise ValueError(f"the chat prompt does not fit max_prompt_tokens={self.max_prompt_tokens} even without "
                         f"past turns ({len(ids)} tokens): raise max_prompt_tokens")

    def appended(self, task: str, observation: str, history: Sequence[tuple[str, str]], info: Mapping[str, Any],
                 k: int) -> list[int] | None:
        """The prompt showing the last ``k`` past turns built from ids: the opening's ids, then per shown turn
        its sampled reply ids and the ids the template puts after them; None when a shown turn has no sampled
        ids (a history written by hand) or the template does not render turn by turn."""
        if self.turn_ids is None:
            return None
        shown = _shown_turns(observation, history, k)
        samples = [getattr(turn, "sample", None) for turn, _ in shown]
        if any(sample is None or sample.candidate_ids is not None for sample in samples):
            return None
        tools = info.get("tools") or None
        role = str(info.get("observation_role", "user"))
        ids = list(self._opening_ids(self.opening(task, observation, history, info, k), tools))
        for sample, (_, after) in zip(samples, shown):
            reply = sample.action_ids  # type: ignore[union-attr]  # checked above
            closing = self.turn_ids.after(reply, [{"role": role, "content": after}], tools)
            if closing is None:
                return None
            ids += [int(i) for i in reply]
            ids += closing
        return ids

    def _opening_ids(self, opening: list[dict[str, str]], tools: Sequence[Mapping[str, Any]] | None) -> tuple[int, ...]:
        """The opening's ids with the generation prompt (kept per opening: every turn of an episode starts with
        them, and the copies of a task share them)."""
        key = json.dumps([opening, tools or []], sort_keys=True, default=str)
        ids = self._openings.get(key)
        if ids is None:
            if len(self._openings) >= 4096:
                self._openings.clear()
            ids = self._openings[key] = tuple(self.encode(opening, tools))
        return ids

    def encode(self, messages: list[dict[str, str]], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """The chat template's token ids of ``messages`` with the next assistant turn's generation prompt;
        ``tools`` (JSON schemas) go to the template (:data:`~milegpo.policies.tools.TOOL_CHAT_TEMPLATE` when
        the tokenizer's own template ignores tools)."""
        encoded = render_chat(self.tokenizer, messages, tools, tokenize=True)
        ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded  # a BatchEncoding in transformers 5
        return [int(i) for i in cast(list[int], ids)]


def _shown_turns(observation: str, history: Sequence[tuple[str, str]],
                 k: int) -> list[tuple[tuple[str, str], str]]:
    """The last ``k`` past steps of ``history``, each with the observation that followed its reply (the next
    step's, or the current ``observation`` after the last one)."""
    following = [step[0] for step in history[1:]] + [observation]
    turns = list(zip(history, following))
    return turns[len(turns) - min(k, len(turns)):] if k > 0 else []
