"""The agent server: one OpenAI-compatible endpoint per process, one session (base URL) per episode.

:func:`agent_server` starts it on first use: a daemon thread runs an asyncio event loop holding a
uvicorn server on a free port of 127.0.0.1 and the agent programs themselves (each a task on the
same loop, so many episodes are in flight at once). Each episode gets a session, and its program
a client whose base URL is ``http://127.0.0.1:PORT/episodes/<session id>/v1``; the routes are
``POST .../chat/completions`` and ``GET .../models``. A request is checked
(:func:`~milegpo.agents.requests.check_request`; OpenAI-style errors, :mod:`milegpo.serve.errors`),
becomes one step of its episode and is answered when the env gives it the policy's reply. A request
to a session that has ended (the episode is over or was cut short) is a 404.

The programs share the loop: a program must not block it (``time.sleep``, a synchronous HTTP call);
run blocking work with ``await asyncio.to_thread(...)``. A blocked loop holds up every episode of the
process, and each of them then ends at its ``timeout``.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import Any

from milegpo.agents.session import Session
from milegpo.serve.errors import APIError

#: seconds the server may take to start listening
START_TIMEOUT = 30.0


class AgentServer:
    """The endpoint and event loop of this process's agent programs (see the module docstring)."""

    def __init__(self, host: str = "127.0.0.1"):
        try:
            import uvicorn
        except ImportError as exc:
            raise ImportError(f"agent programs need fastapi, uvicorn and openai: pip install 'milegpo[agents]' "
                              f"({exc})") from None
        from milegpo.agents.app import build_app
        from milegpo.serve.server import bind

        self.sessions: dict[str, Session] = {}
        self.loop = asyncio.new_event_loop()
        import openai

        # the programs' clients share one pool (openai's limits: 1,000 connections; no timeout: a request waits
        # as long as the policy takes)
        self.http_client = openai.DefaultAsyncHttpxClient(timeout=None)
        sock = bind(host, 0)
        sock.listen(2048)
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(self.session), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="milegpo-agents", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the agent server did not start listening at {self.url}")
            time.sleep(0.01)

    def _serve(self, sock: Any) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.create_task(self._server.serve(sockets=[sock]))
        self.loop.run_forever()

    def open_session(self) -> Session:
        """A new episode's session (its own base URL)."""
        session_id = secrets.token_hex(8)
        session = Session(session_id, f"{self.url}/episodes/{session_id}/v1", self.loop, self.http_client)
        self.sessions[session_id] = session
        return session

    def close_session(self, session: Session) -> None:
        """End an episode's session: its program is cancelled and its URL answers 404 from now on."""
        self.sessions.pop(session.id, None)
        session.close()

    def session(self, session_id: str) -> Session:
        """The open session ``session_id`` (``APIError`` 404 when there is none)."""
        session = self.sessions.get(session_id)
        if session is None:
            raise APIError(f"no open episode session {session_id!r}: its episode has ended (a program must not call "
                           "the model after its episode was cut short)", status=404, code="session_not_found")
        return session


_server: AgentServer | None = None
_lock = threading.Lock()


def agent_server() -> AgentServer:
    """This process's agent server, started on first use."""
    global _server
    with _lock:
        if _server is None:
            _server = AgentServer()
        return _server
