"""uvicorn's httptools protocol: a cap and a deadline on request heads, the TLS client's standing.

httptools has no limit of its own: a client could send megabytes of headers and the server
would buffer them all. The head is counted as it arrives; past ``MAX_HEAD_BYTES`` the request
is answered 400 and the connection closed.

uvicorn times a connection out only while it is idle between requests (its keep-alive timer),
and stops as soon as any byte arrives: a connection that never sends anything, or sends a head
one byte at a time, would be held for ever. A head must be complete within ``head_timeout_s``
of the connection opening, or of its first byte on a kept-alive connection; else the request is
answered 408 (the connection closed without a word when nothing came) and the connection closed.
A response sent before its request's body has all arrived also closes the connection: the rest
of the body would otherwise be read and thrown away for as long as the client keeps sending.
The body's own deadline is the application's (``bodies.BODY_TIMEOUT_S``, shorter for pushes).

Each request's scope carries the names of the client certificate that the TLS layer verified
(``CLIENT_CERT_KEY``), which uvicorn does not pass on by itself: who may call what is the
application's decision.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
"""The request line and every header together (kube-scheduler and agents send under 1 KiB)."""

HEAD_TIMEOUT_S = 10.0
"""Default time from a connection opening (or a request's first byte) to its head complete."""

CLIENT_CERT_KEY = "edgegpu.client_cert"
"""Scope key: the ``PeerCertificate`` of a connection whose client certificate the server
verified; None when it presented none (or TLS verifies none)."""


@dataclass(frozen=True, slots=True)
class PeerCertificate:
    """The names a verified client certificate is for: its subject's CN and its DNS SANs."""

    common_name: str | None
    dns_names: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The CN (when there is one) and then every DNS SAN."""
        return (self.common_name, *self.dns_names) if self.common_name else self.dns_names

    @classmethod
    def from_decoded(cls, cert: dict[str, Any]) -> PeerCertificate:
        """From ``SSLObject.getpeercert()``'s dict (the last CN when the subject has several)."""
        common = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
        dns = tuple(v for k, v in cert.get("subjectAltName", ()) if k == "DNS")
        return cls(common_name=common[-1] if common else None, dns_names=dns)


def peer_certificate(transport: asyncio.BaseTransport) -> PeerCertificate | None:
    """The verified client certificate of a TLS connection, if it presented one.

    With a client CA configured, the handshake refuses a certificate it cannot verify, so one
    that is here was verified; without one, none is asked for and ``getpeercert`` is empty.
    """
    ssl_object = transport.get_extra_info("ssl_object")
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    return PeerCertificate.from_decoded(cert) if cert else None


_TIMED_OUT_TEXT = b"The request head did not arrive in time."
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n"
    b"\r\n%s" % (len(_TIMED_OUT_TEXT), _TIMED_OUT_TEXT)
)


class BoundedHttpTools(HttpToolsProtocol):
    """``HttpToolsProtocol`` with a size cap and a deadline on each request's head."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    """Set on a subclass by ``with_head_timeout``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = 0
        """Bytes of the current request's head so far; None once its headers are complete."""
        self._head_timer: asyncio.TimerHandle | None = None
        self._peer: PeerCertificate | None = None
        """The connection's verified client certificate (read once, when it is made)."""

    @classmethod
    def with_head_timeout(cls, seconds: float) -> type[BoundedHttpTools]:
        """This protocol with another head deadline (uvicorn builds protocols from a class)."""
        return type(cls.__name__, (cls,), {"head_timeout_s": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """A new connection starts with a head to read, and its deadline."""
        self._head_bytes = 0
        super().connection_made(transport)
        self._peer = peer_certificate(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """No deadline outlives its connection."""
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Count the head's bytes before handing them to the parser."""
        if self._head_bytes is not None:
            self._head_bytes += len(data)
            if self._head_timer is None:  # the first byte of a request on a kept-alive connection
                self._arm_head_timer()
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
        cast(dict[str, Any], self.scope)[CLIENT_CERT_KEY] = self._peer

    def on_headers_complete(self) -> None:
        """The head is complete: its deadline is met; the body is capped elsewhere."""
        self._head_bytes = None
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The next request on this connection has a head to read (timed from its first byte)."""
        super().on_message_complete()
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        """Close a connection whose request's body has not all arrived; else as uvicorn does."""
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not self.pipeline:
            self.server_state.total_requests += 1
            self.transport.close()
            return
        super().on_response_complete()

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:
            self.transport.write(_TIMED_OUT)
        self.transport.close()
