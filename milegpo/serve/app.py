"""The HTTP routes of ``milegpo serve`` (FastAPI): ``POST /v1/chat/completions`` and ``GET /v1/models``.

Every error is OpenAI's JSON (:mod:`milegpo.serve.errors`): a bad request is a 4xx naming the
field, an unknown path a 404, a failure while generating a 500 (its traceback goes to the
server's stderr). None of them stops the server. Generation runs on the engine's worker thread,
so the event loop keeps taking requests while one is generated; they are answered in turn.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from milegpo.serve.engine import ChatEngine
from milegpo.serve.errors import APIError, error_body
from milegpo.serve.response import completion_body, stream_events


def openai_app(title: str) -> FastAPI:
    """A FastAPI app whose errors are OpenAI's JSON: an :class:`APIError` as raised, an unknown path or wrong
    method as its 404/405 (shared by ``milegpo serve`` and the agent server)."""
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:  # unknown path, wrong method
        return JSONResponse(error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    return app


async def json_body(http: Request) -> Any:
    """The request's JSON body; a 400 :class:`APIError` when it is not UTF-8, not JSON, or nested past the
    decoder's limit."""
    try:
        return json.loads(await http.body())
    except (ValueError, RecursionError) as exc:
        raise APIError(f"the request body is not valid JSON ({exc})") from None


def build_app(engine: ChatEngine) -> FastAPI:
    """The ASGI app serving ``engine`` (run it with uvicorn, or call it with ``fastapi.testclient``)."""
    app = openai_app("milegpo serve")
    created = int(time.time())
    card = {"id": engine.name, "object": "model", "created": created, "owned_by": "milegpo"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model != engine.name:
            raise APIError(f"model {model!r} is not served here: this server serves {engine.name!r}", status=404,
                           param="model", code="model_not_found")
        return card

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(http: Request) -> dict[str, Any] | StreamingResponse:
        request = engine.parse(await json_body(http))
        try:
            generation = await asyncio.get_running_loop().run_in_executor(engine.executor, engine.generate, request)
        except APIError:
            raise
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            raise APIError(f"generation failed: {type(exc).__name__}: {exc}", status=500) from None
        if request.stream:
            return StreamingResponse(stream_events(generation, request, engine.name, engine.policy.tokenizer),
                                     media_type="text/event-stream")
        return completion_body(generation, request, engine.name, engine.policy.tokenizer)

    return app
