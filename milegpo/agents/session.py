"""One episode of an agent program: the program running against its session, and the steps it asks for.

The program runs as a task on the agent server's event loop (:mod:`milegpo.agents.server`) with an
``openai.AsyncOpenAI`` client whose base URL is the session's own. Each chat completion it sends is
checked, queued as a :class:`Pending` request for the env (on the trainer's thread) and held open
until the env answers it with the policy's reply (:meth:`Session.answer`). When the program returns,
the session scores the episode (the program's return value, or the rubric over the finished
conversation) and queues :class:`Finished`; when the program or the rubric raises, :class:`Raised`.
The env reads these in order (:meth:`Session.next_event`), one at a time.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from milegpo.agents.errors import AgentTimedOut
from milegpo.policies.replies import Reply
from milegpo.serve.errors import APIError
from milegpo.serve.response import message

#: an agent program: ``async def program(client, task) -> reward`` (None when a rubric scores the episode)
Program = Callable[[Any, Any], Awaitable[Any]]
#: a rubric: ``rubric(task, messages) -> reward`` over the finished conversation (a function or ``async def``)
Rubric = Callable[[Any, list[dict[str, Any]]], Any]


@dataclass
class Pending:
    """A chat completion the program sent, waiting for the policy's reply.

    :param messages: the conversation as the program sent it (OpenAI messages).
    :param tools: the function schemas it offered (None: none, or ``tool_choice="none"``).
    :param state_key: the key the program gave in its ``X-Milegpo-State-Key`` header, if any.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    state_key: str | None
    reply: asyncio.Future = field(repr=False)


@dataclass
class Finished:
    """The program returned; ``reward`` is its return value, or its rubric's score when the env has one."""

    reward: Any


@dataclass
class Raised:
    """The program (or its rubric) raised ``error``; ``where`` says which."""

    error: BaseException
    where: str
    details: str


Event = Pending | Finished | Raised


class Session:
    """One episode's program run and its requests (see the module docstring).

    :param session_id: the id in the session's base URL.
    :param base_url: ``http://host:port/episodes/<id>/v1``, what the program's client is given.
    :param loop: the agent server's event loop.
    :param http_client: the server's ``httpx.AsyncClient``, shared by the programs' clients (one connection
        pool for the process; an own client per episode would load TLS certificates and open a connection
        for every episode).
    """

    def __init__(self, session_id: str, base_url: str, loop: asyncio.AbstractEventLoop, http_client: Any):
        self.id, self.base_url, self.loop, self.http_client = session_id, base_url, loop, http_client
        self.requests = 0
        self._events: queue.Queue[Event] = queue.Queue()
        self._pending: Pending | None = None  # the request the server holds open (the loop's side)
        self.waiting: Pending | None = None  # the request the env holds, not answered yet (the trainer's side)
        self._last: tuple[list[dict[str, Any]], Reply | None] = ([], None)  # the last request and its reply
        self._run: Future[None] | None = None

    # -------------------------------------------------------------- trainer's thread
    def start(self, program: Program, task: Any, rubric: Rubric | None) -> None:
        """Start ``program`` on ``task`` on the server's loop."""
        self._run = asyncio.run_coroutine_threadsafe(self._play(program, task, rubric), self.loop)

    def next_event(self, timeout: float) -> Event:
        """The program's next request, or its end; :class:`AgentTimedOut` after ``timeout`` seconds of neither."""
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            raise AgentTimedOut(f"the agent program neither called the model nor returned within {timeout:g} s "
                                "(the env's timeout)") from None
        self.waiting = event if isinstance(event, Pending) else None
        return event

    def answer(self, reply: Reply) -> None:
        """Send the policy's reply to the request the env holds (the last :meth:`next_event`); once: a reply sent
        ahead of the step (:meth:`~milegpo.agents.env.AgentEnv.send_action`) is not sent again by the step."""
        pending, self.waiting = self.waiting, None
        if pending is None:
            return
        self._last = (pending.messages, reply)
        self.loop.call_soon_threadsafe(_resolve, pending.reply, reply)

    def close(self) -> None:
        """Stop the program if it still runs (it sees its task cancelled); a request still held open is answered
        with a 404 (its episode has ended), so the server keeps nothing of an ended episode."""
        if self._run is not None and not self._run.done():
            self._run.cancel()
        pending = self._pending
        if pending is not None:
            ended = APIError("this episode has ended (truncated, or its program failed): its requests are no longer "
                             "answered", status=404, code="session_not_found")
            self.loop.call_soon_threadsafe(_fail, pending.reply, ended)

    # -------------------------------------------------------------- server's loop
    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       state_key: str | None) -> Reply:
        """Queue one request of the program and wait for the policy's reply (``APIError`` 409 when another
        request of this episode is still waiting: an episode is one conversation, step after step)."""
        if self._pending is not None:
            raise APIError("another chat completion of this episode is still waiting for its reply: an episode's "
                           "requests are its steps, one after the other (run parallel work as separate episodes)",
                           status=409, code="concurrent_request")
        pending = self._pending = Pending(messages, tools, state_key, self.loop.create_future())
        self.requests += 1
        self._events.put(pending)
        try:
            return await pending.reply
        finally:
            self._pending = None

    async def _play(self, program: Program, task: Any, rubric: Rubric | None) -> None:
        import openai

        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=f"episode-{self.id}", max_retries=0, timeout=None,
                                    http_client=self.http_client)
        where = "the agent program"
        try:
            result = await program(client, task)
            if rubric is not None:
                where = "the rubric"
                messages, reply = self._last
                conversation = [*messages, message(reply)] if reply is not None else list(messages)
                result = rubric(task, conversation)
                if inspect.isawaitable(result):
                    result = await result
            self._events.put(Finished(result))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the user's code: whatever it raises ends its episode, not the training
            self._events.put(Raised(exc, where, traceback.format_exc()))


def _resolve(future: asyncio.Future, reply: Reply) -> None:
    if not future.done():  # the program may have given up waiting (cancelled)
        future.set_result(reply)


def _fail(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
