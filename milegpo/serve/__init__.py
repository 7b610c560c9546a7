"""The trained policy behind an OpenAI-compatible endpoint (``milegpo serve``).

``milegpo serve RUN_DIR`` loads a run folder, an export or a model (:mod:`~milegpo.serve.loading`),
and answers ``POST /v1/chat/completions`` and ``GET /v1/models`` (:mod:`~milegpo.serve.app`) with
the policy's own chat templating and sampler, token in, token out (:mod:`~milegpo.serve.engine`).
The modules, one job each: ``errors`` (OpenAI-style errors), ``request`` (checking a request; its
messages brought to the chat template's form by :mod:`milegpo.policies.chat_messages`), ``engine``
(generation; each reply's stop strings, finish reason and tool calls by :mod:`milegpo.policies.replies`),
``response`` (the JSON and the stream), ``app`` (the routes), ``server`` (listening).
fastapi and uvicorn are imported only by ``app`` and ``server`` (``pip install 'milegpo[serve]'``).
"""

from milegpo.serve.engine import ChatEngine, Generation
from milegpo.serve.errors import APIError
from milegpo.serve.loading import ServedPolicy, load_served_policy
from milegpo.serve.server import serve

__all__ = ["APIError", "ChatEngine", "Generation", "ServedPolicy", "load_served_policy", "serve"]
