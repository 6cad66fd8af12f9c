"""uvicorn's httptools protocol with a cap on a request's head, and the TLS client's standing.

httptools has no limit of its own: a client could send megabytes of headers and the server
would buffer them all. The head is counted as it arrives; past ``MAX_HEAD_BYTES`` the request
is answered 400 and the connection closed. Each request's scope says whether the connection
presented a client certificate that the TLS layer verified (``CLIENT_CERT_KEY``), which uvicorn
does not pass on by itself.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
"""The request line and every header together (kube-scheduler and agents send under 1 KiB)."""

CLIENT_CERT_KEY = "edgegpu.client_cert"
"""Scope key: True when the connection presented a client certificate the server verified."""


class BoundedHttpTools(HttpToolsProtocol):
    """``HttpToolsProtocol`` refusing a request whose head is over ``MAX_HEAD_BYTES``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = 0
        """Bytes of the current request's head so far; None once its headers are complete."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """A new connection starts with a head to read."""
        self._head_bytes = 0
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """Count the head's bytes before handing them to the parser."""
        if self._head_bytes is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if (
            self._head_bytes is not None
            and self._head_bytes > MAX_HEAD_BYTES
            and not self.transport.is_closing()
        ):
            self.send_400_response("Request line and headers are over the size limit.")

    def on_message_begin(self) -> None:
        """A request begins: its head is counted from here (pipelined bytes before count too)."""
        self._head_bytes = self._head_bytes or 0
        super().on_message_begin()
        ssl_object = self.transport.get_extra_info("ssl_object")
        # With a client CA configured, the handshake already refused a certificate it could not
        # verify; one that is here was verified.
        scope = cast(dict[str, Any], self.scope)
        scope[CLIENT_CERT_KEY] = bool(ssl_object and ssl_object.getpeercert())

    def on_headers_complete(self) -> None:
        """The head is complete: the body is capped elsewhere."""
        self._head_bytes = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The next request on this connection has a head to read."""
        super().on_message_complete()
        self._head_bytes = 0
