""":class:`AgentEnv`: an agent program that calls an LLM through the OpenAI API, as a step-wise text env.

The user gives tasks and an ``async def program(client, task) -> reward`` that runs their agent
against ``client`` (an ``openai.AsyncOpenAI`` whose base URL is the episode's own session on the
agent server, :mod:`milegpo.agents.server`). The env maps the program onto the trainer's loop:

* **episode = session.** ``reset(seed)`` starts the program on task ``seed mod len(tasks)`` and
  returns when its first chat completion request arrives; the K copies of a group play one task.
* **step = request.** The request's messages and tools are the step's prompt: they reach the policy
  in ``info["agent_request"]`` and the policy samples from exactly their prompt ids
  (:mod:`milegpo.policies.chat_requests`); the request says whether it continues the one answered before
  (:func:`~milegpo.agents.conversation.continuation`), so the policy can append to that step's ids.
  ``step(action)`` answers the pending request with that reply and returns when the program's next
  request arrives (reward 0) or when the program returns (the episode ends, reward = its return value,
  or the ``rubric``'s score of the finished conversation).
* **observation and state key.** The request's new messages since the model's last reply, and those
  normalised (:mod:`milegpo.agents.conversation`), or the key the program sends in the
  ``X-Milegpo-State-Key`` header.
* **faults.** A program that raises, that takes longer than ``timeout`` seconds between two model
  calls, or that returns without calling the model ends its episode with one of
  :mod:`milegpo.agents.errors` (an env error: truncated, counted, one console line per kind, training
  goes on). An episode that reaches ``max_episode_steps`` requests is truncated and its program cancelled.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from milegpo.agents import conversation
from milegpo.agents.errors import AgentNeverCalledModel, AgentRaised
from milegpo.agents.server import agent_server
from milegpo.agents.session import Finished, Pending, Program, Raised, Rubric, Session
from milegpo.envs.core import TextEnv
from milegpo.policies.chat_requests import AGENT_REQUEST, CONTINUES
from milegpo.policies.replies import read_reply
from milegpo.serve.response import message

logger = logging.getLogger("milegpo.agents")

#: tasks whose first requests make the default vocabulary of a tiny offline model
VOCABULARY_TASKS = 20
#: requests answered (with an empty reply) per task when collecting the vocabulary
VOCABULARY_STEPS = 3
#: an empty reply, as the env receives it
EMPTY_REPLY = '{"content": "", "finish_reason": "stop"}'
_said_no_splits: set[str] = set()


class AgentEnv(TextEnv):
    """An agent program as a text env (see the module docstring).

    :param program: ``async def program(client: openai.AsyncOpenAI, task) -> float | None``; it may call the
        model any number of times, one request after the other (any ``model`` name: the policy answers).
    :param tasks: the tasks (any picklable values), or ``{split: tasks}`` (e.g. ``train``, ``eval_id``).
    :param rubric: ``rubric(task, messages) -> float`` (a function or ``async def``) scoring the finished
        conversation: the last request's messages and the reply to it; the program's return value is then
        not used. None: the program returns the reward.
    :param timeout: seconds the program may take between two model calls (and before the first, and after
        the last) before its episode is truncated.
    :param success_reward: an episode whose reward reaches it counts as won (``rollout/success_rate``).
    :param split: the tasks played, when ``tasks`` is a mapping (a list is played by every split).
    :param vocabulary: texts added to the default :meth:`vocabulary` (words the model should be able to write).
    :param max_episode_steps: the most requests of one episode.
    :param state_key: ``"env"`` (the program's header key, else the normalised new messages) or
        ``"observation"`` (the new messages exactly).
    """

    action_format = "message"

    def __init__(self, program: Program, tasks: Sequence[Any] | Mapping[str, Sequence[Any]], *,
                 rubric: Rubric | None = None, timeout: float = 60.0, success_reward: float = 1.0,
                 split: str = "train", vocabulary: Sequence[str] = (), max_episode_steps: int = 20,
                 state_key: str = "env", render_mode: str | None = None):
        super().__init__(invalid_action_penalty=0.0, max_episode_steps=max_episode_steps, render_mode=render_mode,
                         state_key=state_key)
        if not (inspect.iscoroutinefunction(program) or inspect.iscoroutinefunction(type(program).__call__)):
            raise TypeError(f"program must be an async function, program(client, task) -> reward; got {program!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.program, self.rubric, self.timeout = program, rubric, float(timeout)
        self.success_reward = float(success_reward)
        self.split = split
        self.tasks = _split_tasks(tasks, split)
        self.extra_vocabulary = [str(text) for text in vocabulary]
        self._session: Session | None = None
        self._pending: Pending | None = None
        self._request: dict[str, Any] | None = None  # the pending request as the policy reads it (info)
        self._key = ""

    @property
    def num_tasks(self) -> int:
        """How many tasks the split holds (the vec env draws distinct ones when a batch fits)."""
        return len(self.tasks)

    # ------------------------------------------------------------------ TextEnv
    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        self._end_session()
        task = self.tasks[(seed or 0) % len(self.tasks)]
        self._session = agent_server().open_session()
        self._session.start(self.program, task, self.rubric)
        event = self._next_event()
        if not isinstance(event, Pending):
            self._end_session()
            raise AgentNeverCalledModel(f"the agent program returned {event.reward!r} without calling the model: "
                                        "an episode needs at least one chat completion (client.chat.completions."
                                        "create) to learn from")
        return self._take(event), {"task": _task_text(task)}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        assert self._session is not None and self._pending is not None  # TextEnv.step: only within an episode
        reply = read_reply(action)
        self._session.answer(reply)  # nothing when send_action delivered it already
        answered = {**self._request, "reply": message(reply)} if self._request is not None else None
        self._release()
        event = self._next_event()
        if isinstance(event, Pending):
            return self._take(event, answered), 0.0, False, {}
        self._end_session()
        reward = _reward(event.reward, "the rubric" if self.rubric is not None else "the agent program")
        self._key = observation = f"episode over: reward {reward:g}"  # the end state, by outcome
        return observation, reward, True, {"won": reward >= self.success_reward}

    def send_action(self, action: str) -> None:
        """Answer the pending request with ``action`` now (a valid one: an empty action leaves it open), so the
        programs of a worker's envs all go on while the worker steps its envs one after the other;
        :meth:`step` then sends nothing again."""
        if self._session is not None and self._pending is not None and self.is_valid_action(action):
            self._session.answer(read_reply(action))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; an episode truncated at ``max_episode_steps`` cancels its program."""
        observation, reward, terminated, truncated, info = super().step(action)
        if truncated:
            self._end_session()
        return observation, reward, terminated, truncated, info

    def is_valid_action(self, action: str) -> bool:
        """Every reply of the policy is answered to the program, an empty one too (``{"content": ""}``): the
        program judges it. Only an empty action, which no reply of the policy is, is invalid (the request
        stays open)."""
        return bool(action.strip())

    def state_key(self) -> str:
        return self._key

    def info_extras(self) -> dict[str, Any]:
        """``agent_request``: the pending request's messages and tools, the prompt the policy acts on
        (:mod:`milegpo.policies.chat_requests`)."""
        return {} if self._request is None else {AGENT_REQUEST: self._request}

    def close(self) -> None:
        self._end_session()
        super().close()

    def vocabulary(self) -> list[str]:
        """Texts covering what the program shows the model (for a tiny offline model's tokenizer): the
        requests of the first :data:`VOCABULARY_TASKS` tasks, each answered with empty replies up to
        :data:`VOCABULARY_STEPS` times, their tools and the tool prompt, and ``vocabulary``."""
        from milegpo.agents.errors import AgentError
        from milegpo.policies.tools import TOOL_CHAT_TEMPLATE

        texts = [*self.extra_vocabulary, *map(_task_text, self.tasks[:VOCABULARY_TASKS])]
        failure: AgentError | None = None
        for seed in range(min(len(self.tasks), VOCABULARY_TASKS)):
            try:
                self.reset(seed=seed)
                for _ in range(VOCABULARY_STEPS):
                    pending = self._pending
                    if pending is None:
                        break
                    texts += conversation.request_texts(pending.messages, pending.tools)
                    if pending.tools:
                        texts.append(TOOL_CHAT_TEMPLATE)
                    if any(self.step(EMPTY_REPLY)[2:4]):
                        break
            except AgentError as exc:  # a program that fails on an empty reply: what it showed before is kept
                failure = exc
            finally:
                self._end_session()
        if len(texts) == len(self.extra_vocabulary) + min(len(self.tasks), VOCABULARY_TASKS) and failure is not None:
            raise failure  # not one request seen: the program is broken, say how
        return texts

    # ------------------------------------------------------------------ helpers
    def _next_event(self) -> Pending | Finished:
        assert self._session is not None
        try:
            event = self._session.next_event(self.timeout)
        except Exception:
            self._end_session()
            raise
        if isinstance(event, Raised):
            self._end_session()
            raise AgentRaised(f"{event.where} raised {type(event.error).__name__}: {event.error}") from event.error
        return event

    def _take(self, pending: Pending, answered: Mapping[str, Any] | None = None) -> str:
        """Make ``pending`` the current step: its observation and state key; ``answered`` is the request the
        policy answered before it, with the reply (the request then says whether it continues that one)."""
        assert self._session is not None
        self._pending = pending
        self._request = {"messages": pending.messages, "tools": pending.tools,
                         CONTINUES: conversation.continuation(answered, pending.messages, pending.tools)}
        self._key = conversation.state_key(pending.messages, pending.state_key)
        return conversation.observation(pending.messages)

    def _release(self) -> None:
        """The current request is answered: forget it."""
        self._pending, self._request = None, None

    def _end_session(self) -> None:
        self._release()
        if self._session is not None:
            agent_server().close_session(self._session)
            self._session = None


def _split_tasks(tasks: Sequence[Any] | Mapping[str, Sequence[Any]], split: str) -> list[Any]:
    """The tasks of ``split``: a mapping's entry, or the list itself (said once per split other than train)."""
    if isinstance(tasks, Mapping):
        if split not in tasks:
            raise ValueError(f"no tasks for split {split!r}: the splits are {sorted(tasks)}")
        chosen = list(tasks[split])
    else:
        chosen = list(tasks)
        if split != "train" and split not in _said_no_splits:
            _said_no_splits.add(split)
            logger.warning("AgentEnv: tasks is a list, not {split: tasks}, so split %r plays the training tasks", split)
    if not chosen:
        raise ValueError(f"the tasks of split {split!r} are empty: give at least one task")
    return chosen


def _task_text(task: Any) -> str:
    """``info["task"]``: a string task itself, any other task as JSON."""
    return task if isinstance(task, str) else json.dumps(task, sort_keys=True, default=str)


def _reward(value: Any, who: str) -> float:
    """A finite number as the episode's reward (``AgentRaised`` naming ``who`` for anything else)."""
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    raise AgentRaised(f"{who} returned {value!r}, not a reward: return a finite number (or give the env a rubric)")
