"""`verifiers <https://pypi.org/project/verifiers/>`_ (Prime Intellect) environments as milegpo envs
(``verifiers:<environment id>``, loaded by verifiers' own ``load_environment``), played step by step.

A verifiers environment (``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``, ...) runs its own rollout
loop: it asks a model client for each assistant message, answers with ``env_response``, stops when one
of its ``@stop`` conditions fires and scores the finished conversation with its rubric. Here the model
is milegpo's policy: the adapter runs verifiers' own ``rollout`` on a private event loop with a client
(:class:`_PolicyClient`) that hands each prompt to milegpo and waits for the policy's reply, so
verifiers' loop, stop conditions and rubric run unchanged and no model endpoint is called. How the
conventions map:

* **Task and seed.** ``reset(seed=s)`` plays row ``s mod len(dataset)`` of the environment's dataset
  (``get_dataset()``; ``split="eval"`` takes ``get_eval_dataset()``): a group of K copies shares one
  row. The row's prompt messages (its system prompt and question) are the opening chat messages
  (``info["messages"]``); its last user message is the ``task`` and the first observation.
* **Observation.** The messages ``env_response`` answers with (their text joined); at the end of an
  episode, the environment's ``final_env_response`` when it gives one.
* **Reward and success.** 0 on every step before the end; when verifiers ends the rollout, its rubric's
  reward (``rubric.score_rollout``: the weighted sum of its reward functions; the metrics are in
  ``info["verifiers_metrics"]``). Won is a reward of at least the environment's own
  ``pass_threshold`` (verifiers' pass threshold, 0.5 by default), unless ``success_reward`` is given.
* **Actions.** The whole reply (``action_format="message"``), which becomes the assistant message.
  An environment with tools (``tool_defs``, e.g. a ``ToolEnv``) is played with tool calls
  (:class:`VerifiersToolEnv`, ``action_format="tools"``; name it yourself for an environment whose
  rows alone declare tools, ``info["tool_defs"]``): the tools verifiers offers with each request are
  declared to the chat template, parsed calls become the assistant message's ``tool_calls``, a reply
  without a call is a plain message (verifiers ends a ``ToolEnv`` rollout on it: the final answer).
* **State key.** The turn number and the normalised observation (verifiers keeps no state of its own
  beyond the conversation); ``state_key_fn`` overrides it.

Rubrics with group-level reward functions (which score K rollouts together) have no per-episode
reward and are refused; so is an environment that rewrites the conversation between turns (its own
``get_prompt_messages``), since milegpo's chat prompt grows by one turn per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from milegpo.envs.core import normalize_text
from milegpo.envs.hubs.base import NO_OBSERVATION, HubEnv, import_hub
from milegpo.envs.hubs.tools import ToolEnv
from milegpo.envs.user_modules import import_user_module, user_module_error
from milegpo.policies.tools import read_tool_calls

INSTALL_HINT = ('pip install --no-deps verifiers==0.2.0 openai-agents==0.24.0 && pip install "milegpo[verifiers]"  '
                "(0.2.1-0.3.1 pin mcp<2 against vLLM's mcp>=2; 0.4.0 has no step-wise environment API)")
MODEL_NAME = "milegpo-policy"


def import_verifiers() -> Any:
    """``verifiers``, or an ImportError naming the install command."""
    return import_hub("verifiers", INSTALL_HINT)


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """Without ``datasets``' progress bars: verifiers formats its data set with ``Dataset.map`` in every
    copy of the env (one bar per worker and copy otherwise); the previous setting is restored."""
    import datasets

    disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not disabled:
            datasets.enable_progress_bars()


def message_text(message: Any) -> str:
    """The text of a verifiers message (a pydantic message or a dict; content as a string or parts)."""
    content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None) for part in content]
    return "\n".join(str(part) for part in parts if part)


def message_role(message: Any) -> str:
    """The role of a verifiers message (a pydantic message or a dict)."""
    return str(message.get("role") if isinstance(message, Mapping) else message.role)


@functools.cache
def _policy_client_class(vf: Any) -> type:
    """The verifiers ``Client`` subclass through which verifiers' rollout asks milegpo's policy (defined
    here, on first use: its base class is verifiers')."""

    class _PolicyClient(vf.Client):
        """A verifiers model client whose "model" is milegpo's policy: each request publishes the prompt
        (``asked``) and waits for the reply the adapter's ``step`` sets (``reply``)."""

        def __init__(self) -> None:
            super().__init__(None)
            self.asked: asyncio.Future[list[Any]] | None = None
            self.reply: asyncio.Future[Any] | None = None  # the verifiers Response of the policy's reply
            self.tools: list[Any] = []  # the tools (vf.Tool) verifiers offers with the current request

        def setup_client(self, config: Any) -> None:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                                      **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            self.reply = loop.create_future()
            if self.asked is None or self.asked.done():
                raise RuntimeError("verifiers asked for a reply the adapter did not wait for")
            self.tools = list(tools or [])
            self.asked.set_result(list(prompt))
            return await self.reply

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return _PolicyClient


class VerifiersEnv(HubEnv):
    """A verifiers environment as a :class:`~milegpo.envs.TextEnv` (see the module docstring).

    :param environment: a verifiers environment id (the module ``load_environment`` imports, e.g. an
        installed environment package or a module in the working directory) or an ``Environment`` instance.
    :param environment_kwargs: the arguments of its ``load_environment``.
    :param split: ``"train"`` (``get_dataset()``) or ``"eval"`` (``get_eval_dataset()``).
    :param success_reward: the reward from which an episode is won; default: the environment's
        ``pass_threshold``.
    """

    def __init__(self, environment: str | Any, environment_kwargs: Mapping[str, Any] | None = None,
                 split: str = "train", success_reward: float | None = None, commands: Sequence[str] | None = None,
                 state_key_fn: Callable[[Any], str] | None = None, invalid_action_penalty: float = 0.0,
                 max_episode_steps: int = 50, render_mode: str | None = None):
        vf = import_verifiers()
        with quiet_datasets():
            self.hub: Any = load_verifiers_environment(environment, environment_kwargs)
        self.environment_id = environment if isinstance(environment, str) else type(environment).__name__
        if self.hub.rubric.has_group_rewards:
            raise ValueError(f"the verifiers environment {self.environment_id!r} has group-level reward functions "
                             "(they score K rollouts together); an episode needs a reward of its own")
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        threshold = float(self.hub.pass_threshold) if success_reward is None else float(success_reward)
        super().__init__(threshold, commands, state_key_fn, invalid_action_penalty, max_episode_steps, render_mode)
        with quiet_datasets():
            self.dataset = self.hub.get_dataset() if split == "train" else self.hub.get_eval_dataset()
        if len(self.dataset) == 0:
            raise ValueError(f"the verifiers environment {self.environment_id!r} has an empty {split} dataset")
        self._vf = vf
        self._loop = asyncio.new_event_loop()
        self._client = _policy_client_class(vf)()
        self._rollout: asyncio.Task[Any] | None = None
        self._prompt: list[Any] = []
        self._turn = 0
        self.row_index = 0
        self.final_state: Any = None

    # ------------------------------------------------------------ driving verifiers' rollout
    async def _play(self, row: dict[str, Any]) -> Any:
        """Verifiers' own rollout and rubric scoring of one dataset row (``Environment.run_rollout``'s
        steps without its output conversion), with milegpo's policy as the model."""
        state = await self.hub.rollout(row, self._client, MODEL_NAME, {})
        await self.hub.rubric.score_rollout(state)
        await self.hub.rubric.cleanup(state)
        return state

    def _advance(self) -> list[Any] | None:
        """Run verifiers' rollout until it asks the policy again (the new prompt) or ends (None)."""
        assert self._rollout is not None
        asked: asyncio.Future[list[Any]] = self._loop.create_future()
        self._client.asked = asked
        self._loop.run_until_complete(asyncio.wait([asked, self._rollout], return_when=asyncio.FIRST_COMPLETED))
        if asked.done():
            return asked.result()
        self.final_state = self._rollout.result()  # raises what the rollout raised
        return None

    def _cancel_rollout(self) -> None:
        if self._rollout is not None and not self._rollout.done():
            self._rollout.cancel()
            self._loop.run_until_complete(asyncio.gather(self._rollout, return_exceptions=True))
        self._rollout = None

    def _reply_message(self, action: str) -> Any:
        """The assistant message verifiers receives for ``action``: its text."""
        return self._vf.types.ResponseMessage(content=action, finish_reason="stop", is_truncated=False)

    # ------------------------------------------------------------ TextEnv
    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        self._cancel_rollout()
        self.row_index = self.seed_of(seed) % len(self.dataset)
        row = dict(self.dataset[self.row_index])
        self.final_state = None
        self._turn = 0
        self._rollout = self._loop.create_task(self._play(row))
        prompt = self._advance()
        if prompt is None:
            raise RuntimeError(f"the verifiers environment {self.environment_id!r} ended row {self.row_index} "
                               f"before asking for a reply: {self.final_state.get('error')!r}")
        self._prompt = prompt
        messages = [{"role": message_role(m), "content": message_text(m)} for m in prompt]
        users = [m["content"] for m in messages if m["role"] == "user"]
        task = users[-1] if users else messages[-1]["content"]
        return task or NO_OBSERVATION, {"task": task, "messages": messages, "verifiers_row": self.row_index}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        assert self._client.reply is not None
        self._client.reply.set_result(self._vf.types.Response(
            id=f"milegpo-{self.row_index}-{self._turn}", created=int(time.time()), model=MODEL_NAME,
            message=self._reply_message(action)))
        self._turn += 1
        previous = self._prompt
        prompt = self._advance()
        if prompt is not None:
            if [message_text(m) for m in prompt[:len(previous)]] != [message_text(m) for m in previous]:
                raise NotImplementedError(f"the verifiers environment {self.environment_id!r} rewrote the "
                                          "conversation (its own get_prompt_messages): milegpo's chat prompt "
                                          "grows by one turn per step")
            self._prompt = prompt
            return self._joined(prompt[len(previous) + 1:]), 0.0, False, {}  # after the sent prompt and the reply
        state = self.final_state
        final = state.get("final_env_response") or []
        reward = float(state.get("reward") or 0.0)
        info = {"won": reward >= self.success_reward, "score": reward,
                "verifiers_metrics": dict(state.get("metrics") or {}),
                "verifiers_stop": state.get("stop_condition")}
        if state.get("error") is not None:  # verifiers ended the rollout on an error, and scored it
            info["verifiers_error"] = repr(state["error"])
        return self._joined(final), reward, True, info

    @staticmethod
    def _joined(messages: Sequence[Any]) -> str:
        return "\n".join(text for text in (message_text(m).strip() for m in messages) if text) or NO_OBSERVATION

    def hub_state_key(self) -> str:
        return f"{self._turn}|{normalize_text(self._observation)}"

    def close(self) -> None:
        self._cancel_rollout()
        if not self._loop.is_closed():
            self._loop.close()
        super().close()


class VerifiersToolEnv(VerifiersEnv, ToolEnv):
    """A verifiers environment with tools (``tool_defs``, e.g. a ``ToolEnv``; or rows with their own
    ``info["tool_defs"]``), played with tool calls (see the module docstring). Any non-empty reply is
    an action: its parsed calls become the assistant message's ``tool_calls`` (verifiers runs them and
    answers with ``tool`` messages, an unknown function included), a reply without a call is the
    final answer."""

    def tools(self) -> list[dict[str, Any]]:
        """The tools verifiers offers with its current request (a row's own ``info["tool_defs"]``, else the
        environment's), as chat-template JSON schemas."""
        defs = self._client.tools or self.hub.tool_defs or []
        return [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                  "parameters": dict(tool.parameters)}} for tool in defs]

    def is_valid_action(self, action: str) -> bool:
        return bool(action.strip()) and (self.commands is None or action.strip() in self.commands)

    def _reply_message(self, action: str) -> Any:
        calls = read_tool_calls(action)
        if calls is None:
            return super()._reply_message(action)
        tool_calls = [self._vf.types.ToolCall(id=f"call_{self._turn}_{i}", name=call["name"],
                                              arguments=json.dumps(call["arguments"]))
                      for i, call in enumerate(calls)]
        return self._vf.types.ResponseMessage(content=None, tool_calls=tool_calls, finish_reason="tool_calls",
                                              is_truncated=False)


def check_verifiers_id(environment: str) -> None:
    """Import the module of the verifiers environment id ``environment`` (the one verifiers'
    ``load_environment`` imports: ``my-env`` is ``my_env``) as ``python -m`` would: installed, else from the
    working directory, where verifiers alone would not look. :class:`~milegpo.envs.UnknownEnvError` when it is
    in neither place; an ImportError when it imports a package that is not installed."""
    import_verifiers()
    from verifiers.utils.env_utils import env_module_name

    module = env_module_name(environment)
    try:
        import_user_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0]:
            raise
        raise user_module_error(module, f"the module of the verifiers environment {environment!r}", exc) from None


def load_verifiers_environment(environment: str | Any, environment_kwargs: Mapping[str, Any] | None = None) -> Any:
    """A verifiers ``Environment``: ``environment`` itself, or verifiers' ``load_environment(id, **kwargs)``
    (its module imported first by :func:`check_verifiers_id`, so a module in the working directory is found)."""
    vf = import_verifiers()
    if isinstance(environment, str):
        check_verifiers_id(environment)
        return vf.load_environment(environment, **dict(environment_kwargs or {}))
    if isinstance(environment, vf.Environment):
        return environment
    raise TypeError(f"environment must be a verifiers environment id or a verifiers.Environment, "
                    f"got {type(environment).__name__}")


def make_verifiers_env(environment: str | Any, environment_kwargs: Mapping[str, Any] | None = None,
                       **kwargs: Any) -> HubEnv:
    """The adapter a verifiers environment needs: :class:`VerifiersToolEnv` when it declares tools
    (``tool_defs``), else :class:`VerifiersEnv`. The entry point of ``verifiers:`` env ids."""
    with quiet_datasets():
        hub = load_verifiers_environment(environment, environment_kwargs)
    adapter = VerifiersToolEnv if hub.tool_defs else VerifiersEnv
    env = adapter(hub, **kwargs)
    env.environment_id = environment if isinstance(environment, str) else env.environment_id
    return env
