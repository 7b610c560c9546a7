"""The policy answering chat completions: messages in, token ids through the policy's sampler, replies out.

:class:`ChatEngine` does what the policy does in generate mode with the chat prompt format, with
the request's messages as the conversation: the tokenizer's chat template turns them into prompt
ids (:meth:`ChatPromptBuilder.encode <milegpo.policies.prompts.ChatPromptBuilder.encode>`, tools
rendered as in training), the policy's own sampler (:attr:`LLMPolicy.sampler
<milegpo.policies.LLMPolicy.sampler>`: the HF sampler, or the vLLM one when the policy was
configured with it) generates from those ids, and the reply is read back from the generated ids
(:mod:`milegpo.policies.replies`). At temperature 0 a reply is the policy's own greedy generation.

Generation runs on one worker thread (:attr:`ChatEngine.executor`), one request at a time: the
web server's event loop stays free to take requests, and a reply never depends on which other
requests were waiting (batching rows of different prompts adds float noise to the logits).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th

from milegpo.policies.model import forward_model, merged_forwards
from milegpo.policies.parsing import action_parser
from milegpo.policies.replies import Reply, make_reply
from milegpo.policies.tools import renders_tools
from milegpo.policies.vllm_sampler import VLLMSampler
from milegpo.serve.errors import APIError
from milegpo.serve.request import ChatRequest, parse_chat_request


@dataclass
class Generation:
    """A request's prompt ids and its replies (the token-level record of one chat completion)."""

    prompt_ids: list[int]
    replies: list[Reply]


class ChatEngine:
    """Chat completions from a generate-capable :class:`~milegpo.policies.LLMPolicy`.

    :param policy: the policy (its model, tokenizer, sampler and temperature are used as they are).
    :param name: the model name clients address it by.
    """

    def __init__(self, policy: Any, name: str):
        self.policy, self.name = policy, name
        policy.set_training_mode(False)  # no dropout: replies are the policy's as it acts
        tokenizer = policy.tokenizer
        self.prompts = policy.request_prompts
        self.native_tools = renders_tools(tokenizer)
        self.parse_tools = action_parser("tools", tokenizer)
        self.context_length = context_length(policy)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="milegpo-serve")
        self._seeds = np.random.default_rng()

    def parse(self, body: Any) -> ChatRequest:
        """The checked request of a JSON body (``APIError`` 400 naming what is wrong)."""
        return parse_chat_request(body, self.name, self.policy.temperature, self.native_tools)

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The request's messages (and tools) through the chat template, as token ids."""
        from jinja2 import TemplateError

        try:
            return self.prompts.encode(request.messages, request.tools)
        except TemplateError as exc:  # a template that refuses a conversation (e.g. roles that do not alternate)
            raise APIError(f"the model's chat template refuses these messages: {exc}", param="messages") from None

    def generate(self, request: ChatRequest) -> Generation:
        """The replies to ``request`` (run it on :attr:`executor`; ``APIError`` 400 when it does not fit)."""
        prompt = self.prompt_ids(request)
        max_tokens = self.max_tokens(len(prompt), request.max_tokens)
        first = int(self._seeds.integers(2**31 - 1)) if request.seed is None else request.seed
        # greedy decoding takes the argmax at any temperature: at T = 1 the log-probs are the model's own
        temperature = 1.0 if request.greedy else request.temperature
        with th.no_grad(), merged_forwards(self.policy.model):  # the adapter merged in, as the policy acts
            completions = self.policy.sampler.generate([prompt] * request.n, temperature, max_tokens, request.greedy,
                                                       [first + k for k in range(request.n)])
            replies = [make_reply(c, self.policy.tokenizer, self.policy.eos_ids, request.stop,
                                  self.parse_tools if request.tools else None) for c in completions]
            if request.top_logprobs:
                for reply in replies:
                    reply.top_logprobs = self.top_logprobs(prompt, reply.token_ids, temperature, request.top_logprobs)
        return Generation(prompt, replies)

    def max_tokens(self, prompt_tokens: int, asked: int | None) -> int:
        """The reply budget: ``asked`` (default: the policy's ``max_new_tokens``, as long as it fits), refused
        with a ``context_length_exceeded`` 400 when the prompt and the reply do not fit the context."""
        room = self.context_length - prompt_tokens
        budget = min(self.policy.config.max_new_tokens, room) if asked is None else asked
        if budget < 1 or budget > room:
            wanted = f"{prompt_tokens} prompt tokens" + (f" + max_tokens {asked}" if asked is not None else "")
            raise APIError(f"{wanted} do not fit the model's context of {self.context_length} tokens: shorten the "
                           "messages or lower max_tokens", param="messages", code="context_length_exceeded")
        return budget

    def top_logprobs(self, prompt: list[int], reply: list[int], temperature: float,
                     k: int) -> list[list[tuple[int, float]]]:
        """The ``k`` most likely tokens and their log-probs at each reply position (one forward pass of the
        policy's model over prompt + reply, at the temperature the reply was sampled with)."""
        if not reply:
            return []
        ids = th.tensor([prompt + reply], device=self.policy.device)
        logits = forward_model(self.policy.model)(input_ids=ids).logits[0, len(prompt) - 1: -1].float() / temperature
        values, indices = th.log_softmax(logits, dim=-1).topk(k, dim=-1)
        return [list(zip(i.tolist(), v.tolist())) for i, v in zip(indices, values)]

    def close(self) -> None:
        """Stop the worker thread and release the sampler (a vLLM engine)."""
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.policy.close()


def context_length(policy: Any) -> int:
    """The most tokens (prompt + reply) one request may hold: the vLLM engine's ``max_model_len`` with the
    vLLM sampler, else the model's position limit (``max_position_embeddings`` / ``n_positions``)."""
    if isinstance(policy.sampler, VLLMSampler):
        return int(policy.sampler.max_model_len)
    config = policy.model.get_base_model().config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not limit:
        raise ValueError(f"the model's config ({type(config).__name__}) names no context length "
                         "(max_position_embeddings): it cannot be served")
    return int(limit)
