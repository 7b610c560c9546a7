"""The HTTP routes of the agent server (FastAPI): ``POST /episodes/<id>/v1/chat/completions`` and
``GET /episodes/<id>/v1/models``, with OpenAI-style errors (:mod:`milegpo.serve.errors`) that leave the
server up. fastapi is imported here only (:mod:`milegpo.agents.server` imports this module when it starts, and
hands the routes its sessions).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from milegpo.agents.conversation import STATE_KEY_HEADER
from milegpo.agents.replies import completion_events, completion_json
from milegpo.agents.requests import MODEL_NAME, check_request
from milegpo.agents.session import Session
from milegpo.serve.app import json_body, openai_app


def build_app(session_of: Callable[[str], Session]) -> FastAPI:
    """The FastAPI app of the agent server's routes; ``session_of`` gives the open session of an id (``APIError``
    404 when there is none: :meth:`~milegpo.agents.server.AgentServer.session`)."""
    app = openai_app("milegpo agents")
    card = {"id": MODEL_NAME, "object": "model", "created": int(time.time()), "owned_by": "milegpo"}

    @app.get("/episodes/{session_id}/v1/models")
    async def models(session_id: str) -> dict[str, Any]:
        session_of(session_id)
        return {"object": "list", "data": [card]}

    @app.post("/episodes/{session_id}/v1/chat/completions", response_model=None)
    async def chat_completions(session_id: str, http: Request) -> dict[str, Any] | StreamingResponse:
        session = session_of(session_id)
        body = await json_body(http)
        request = check_request(body)
        reply = await session.complete(body["messages"], request.tools, http.headers.get(STATE_KEY_HEADER))
        if request.stream:
            return StreamingResponse(completion_events(reply, body["model"]), media_type="text/event-stream")
        return completion_json(reply, body["model"])

    return app
