"""OpenAI-style errors: one exception the request handling raises and the JSON body it becomes.

A client of the OpenAI API reads ``{"error": {"message", "type", "param", "code"}}`` with the
HTTP status (``openai.BadRequestError`` for 400, ``openai.InternalServerError`` for 500, ...), so
every refusal of the server has that form and names what to change.
"""

from __future__ import annotations

from typing import Any

#: the ``type`` OpenAI gives a client's mistake (4xx) and a failure of the server (5xx)
INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class APIError(Exception):
    """A request the server answers with an error instead of a completion.

    :param message: what is wrong and what to send instead (one sentence).
    :param status: the HTTP status (400 for a bad request).
    :param param: the request field at fault, when there is one.
    :param code: a machine-readable code (``"context_length_exceeded"``, ``"model_not_found"``, ...).
    """

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, int(status), param, code

    def body(self) -> dict[str, Any]:
        """The error as OpenAI writes it."""
        return error_body(self.message, self.status, self.param, self.code)


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}`` for ``status``: an ``invalid_request_error`` below 500, else a ``server_error``."""
    kind = INVALID_REQUEST if status < 500 else SERVER_ERROR
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
