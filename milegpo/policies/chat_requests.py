"""The policy's side of a step whose prompt is a chat request (an agent program's): the prompt is the
request's own messages, the action its reply.

An :class:`~milegpo.agents.AgentEnv` step carries the program's pending request in
``info["agent_request"]`` (:data:`AGENT_REQUEST`: ``{"messages": [...], "tools": [...] | None, "continues":
...}``, the messages as the program sent them). :class:`~milegpo.policies.LLMPolicy` then builds the prompt
from those messages alone (:func:`request_prompt`: the message conversion and the policy's chat template,
as ``milegpo serve`` does; not from the task, the observation and a history of its own), or, when the
request re-sends the conversation with the policy's last reply unchanged, from the last prompt, the
reply's sampled ids and the template's ids of the new messages (:func:`continued_prompt`), samples from
those ids, and hands the env the reply as :func:`~milegpo.policies.replies.reply_action` writes it
(:func:`answer_requests`; the env answers its program when the vec env sends it its action,
:meth:`~milegpo.envs.core.TextEnv.send_action`). The trainer keeps the prompt ids and the sampled ids and
log-probs of every step and scores exactly those: nothing is re-tokenised from text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from milegpo.policies.chat_messages import chat_messages
from milegpo.policies.parsing import action_parser
from milegpo.policies.replies import make_reply, reply_action
from milegpo.policies.sampling import Completion
from milegpo.policies.tools import renders_tools

if TYPE_CHECKING:
    from milegpo.policies.prompts import ChatPromptBuilder

#: the info key of a step whose prompt is an agent program's request
AGENT_REQUEST = "agent_request"
#: the request's key saying how it continues the request answered before it
#: (:func:`milegpo.agents.conversation.continuation`)
CONTINUES = "continues"


def request_prompt(policy: Any, request: Mapping[str, Any], history: Sequence[tuple[str, str]] = ()) -> list[int]:
    """The prompt ids of an agent request: its messages (and tools) through the policy's chat template, or,
    when it continues the request answered at the last step of ``history`` with that step's reply kept as
    the policy wrote it, that step's prompt and sampled ids and the ids of the messages new since
    (:func:`continued_prompt`). ``ValueError`` when the tokenizer has no chat template or the prompt
    exceeds ``max_prompt_tokens``."""
    tokenizer = policy.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"an agent program's requests are chat messages, and the tokenizer of {policy.model_name} "
                         "has no chat template: train an instruct/chat model")
    limit = int(policy.config.max_prompt_tokens)
    prompts = policy.request_prompts
    native_tools = renders_tools(tokenizer)
    messages = chat_messages(list(request["messages"]), native_tools)
    ids = continued_prompt(prompts, request, messages, history, native_tools) or \
        prompts.encode(messages, request.get("tools"))
    if len(ids) > limit:
        raise ValueError(f"an agent program sent a conversation of {len(ids)} tokens, more than "
                         f"policy.max_prompt_tokens={limit}: raise max_prompt_tokens, or end the program's "
                         "episodes sooner (the env's max_episode_steps, or a shorter conversation)")
    return ids


def continued_prompt(prompts: ChatPromptBuilder, request: Mapping[str, Any], messages: Sequence[Mapping[str, Any]],
                     history: Sequence[tuple[str, str]], native_tools: bool) -> list[int] | None:
    """Token in, token out for an agent: the last step's prompt ids and sampled reply ids, then the ids the
    chat template puts after a reply for the messages that followed it, when the request continues the last
    one (:data:`CONTINUES`), the program sent the policy's reply back unchanged (compared as rendered) and
    the last step of ``history`` holds its sample; None otherwise (rendered from the messages)."""
    continues = request.get(CONTINUES)
    sample = getattr(history[-1], "sample", None) if history else None
    turn_ids = prompts.turn_ids
    if continues is None or sample is None or turn_ids is None or sample.candidate_ids is not None:
        return None
    length = int(continues["length"])
    reply = chat_messages([continues["reply"]], native_tools)[0]  # rendered as the program's copy of it is
    if len(messages) <= length + 1 or dict(messages[length]) != reply:
        return None
    after = turn_ids.after(sample.action_ids, messages[length + 1:], request.get("tools"))
    return None if after is None else [*sample.prompt_ids, *sample.action_ids, *after]


def answer_requests(policy: Any, samples: Sequence[Any], infos: Sequence[Mapping[str, Any]]) -> None:
    """Turn the samples of agent steps into replies (``sample.text`` becomes the env's action); the sampled
    ids and log-probs are left as they are."""
    parse_tools = action_parser("tools", policy.tokenizer)
    for sample, info in zip(samples, infos):
        request = info.get(AGENT_REQUEST)
        if request is None:
            continue
        completion = Completion(list(sample.action_ids), sample.old_logprobs)
        reply = make_reply(completion, policy.tokenizer, policy.eos_ids, (),
                           parse_tools if request.get("tools") else None)
        sample.text, sample.parsed = reply_action(reply), True
