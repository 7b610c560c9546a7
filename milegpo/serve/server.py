"""``milegpo serve``: load what to serve, listen, print one line, run uvicorn until Ctrl-C.

The port is bound before the model loads (a port in use is reported at once, not after a long
load) and starts accepting once it has loaded; ``port=0`` takes any free port. The start line
names the base URL an ``openai`` client takes and the model name it sends.
"""

from __future__ import annotations

import socket
import sys
from typing import TextIO

from milegpo.serve.loading import ServedPolicy, load_served_policy

INSTALL_HINT = "milegpo serve needs fastapi and uvicorn: pip install 'milegpo[serve]'"


def serve(source: str, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          device: str = "auto", access_log: bool = False, out: TextIO | None = None) -> None:
    """Serve ``source`` (a run folder, an export, or a model: :func:`~milegpo.serve.loading.load_served_policy`)
    at ``http://host:port/v1`` until interrupted.

    :param model_name: the name clients send as ``model`` (default: the folder's name, or the hub id).
    :param device: where an export or a model is loaded (a run folder loads on its ``run.device``).
    :param access_log: log every request (uvicorn's access log) instead of warnings only.
    Raises ``ValueError`` for a port that cannot be bound, ``ImportError`` without fastapi/uvicorn.
    """
    try:
        import uvicorn

        from milegpo.serve.app import build_app
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from None
    from milegpo.serve.engine import ChatEngine

    sock = bind(host, port)
    try:
        served = load_served_policy(source, device)
        engine = ChatEngine(served.policy, model_name or served.name)
        try:
            sock.listen(2048)
            print(start_line(served, engine.name, host, sock.getsockname()[1]), file=out or sys.stdout, flush=True)
            config = uvicorn.Config(build_app(engine), log_level="info" if access_log else "warning",
                                    access_log=access_log)
            try:
                uvicorn.Server(config).run(sockets=[sock])
            except KeyboardInterrupt:  # Ctrl-C is how it stops: uvicorn shut down cleanly, then raised it again
                pass
        finally:
            engine.close()
    finally:
        sock.close()


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``ValueError`` naming the address when it cannot be)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets that name it, and with
    # it on, every small request waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:  # taken, not an address here, or a port outside 0-65535
        sock.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"cannot listen on {host}:{port} ({reason}): choose another --port or --host") from None
    return sock


def start_line(served: ServedPolicy, name: str, host: str, port: int) -> str:
    """The one line the server prints when it accepts requests."""
    shown = f"[{host}]" if ":" in host else host
    line = (f"Serving {name!r} ({_KINDS[served.kind]}) at http://{shown}:{port}/v1: OpenAI-compatible "
            f"chat completions (openai.OpenAI(base_url=..., api_key=\"none\"), model={name!r}); Ctrl-C stops")
    if served.trained_mode == "choose":
        line += ("; note: this run trained in choose mode (it scored an env's admissible commands), the endpoint "
                 "generates free text from the same model")
    return line


_KINDS = {"run": "run folder", "adapter": "exported LoRA adapter", "model": "model"}
