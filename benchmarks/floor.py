"""The floor: the least any extender must do — parse the body with the fastest JSON parser and
answer in the same shape (every node passes, score 0) — under the same uvicorn settings.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def answer(path: str, body: bytes) -> bytes:
    doc = orjson.loads(body)
    if path == "/v1/telemetry":
        return b'{"accepted":true}'
    names = doc.get("NodeNames")
    nodes = doc.get("Nodes")
    if path == "/filter":
        return orjson.dumps(
            {
                "Nodes": nodes,
                "NodeNames": names,
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": "",
            }
        )
    if names is None:
        names = [n["metadata"]["name"] for n in nodes["items"]]
    return orjson.dumps([{"Host": n, "Score": 0} for n in names])


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = await _body(receive)
    out = b'{"status":"ok"}' if scope["method"] == "GET" else answer(scope["path"], body)
    # The same headers as the extender's fast path (a Content-Length, so no chunked framing).
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def serve(asgi_app: Any) -> None:
    """Run an ASGI app on 127.0.0.1:--port exactly as the extender runs (uvicorn options)."""
    import uvicorn

    from scheduler_extender.api.server import uvicorn_options

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    uvicorn.run(asgi_app, host="127.0.0.1", port=args.port, **uvicorn_options())


def main() -> None:
    serve(app)


if __name__ == "__main__":
    main()
