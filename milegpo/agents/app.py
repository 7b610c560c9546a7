"""The HTTP routes of the agent server (FastAPI): ``POST /episodes/<id>/v1/chat/completions`` and
``GET /episodes/<id>/v1/models``, with OpenAI-style errors (:mod:`milegpo.serve.errors`) that leave the
server up. fastapi is imported here only (:mod:`milegpo.agents.server` imports this module when it starts).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from milegpo.agents.conversation import STATE_KEY_HEADER
from milegpo.agents.replies import completion_events, completion_json
from milegpo.agents.requests import MODEL_NAME, check_request
from milegpo.serve.errors import APIError, error_body

if TYPE_CHECKING:
    from milegpo.agents.server import AgentServer

def build_app(server: AgentServer) -> FastAPI:
    """The FastAPI app of the agent server's routes."""
    app = FastAPI(title="milegpo agents", docs_url=None, redoc_url=None, openapi_url=None)
    card = {"id": MODEL_NAME, "object": "model", "created": int(time.time()), "owned_by": "milegpo"}

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:  # unknown path, wrong method
        return JSONResponse(error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.get("/episodes/{session_id}/v1/models")
    async def models(session_id: str) -> dict[str, Any]:
        server.session(session_id)
        return {"object": "list", "data": [card]}

    @app.post("/episodes/{session_id}/v1/chat/completions", response_model=None)
    async def chat_completions(session_id: str, http: Request) -> dict[str, Any] | StreamingResponse:
        session = server.session(session_id)
        try:
            body = json.loads(await http.body())
        except (ValueError, RecursionError) as exc:
            raise APIError(f"the request body is not valid JSON ({exc})") from None
        request = check_request(body)
        reply = await session.complete(body["messages"], request.tools, http.headers.get(STATE_KEY_HEADER))
        if request.stream:
            return StreamingResponse(completion_events(reply, body["model"]), media_type="text/event-stream")
        return completion_json(reply, body["model"])

    return app
