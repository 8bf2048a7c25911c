"""The checks every request passes before any route sees it: what a web page can send.

On loopback without a token, nothing but the network protects the REST API, and the
operator's browser is on that network. A page can reach the API two ways, and this
middleware, outermost around the app so that no route can forget it, closes both:

- DNS rebinding: the page's own host name is made to resolve to 127.0.0.1, so the browser
  sends the page's requests to the API as the page's own origin, and lets it read the
  answers. The browser still sends the page's name in ``Host``: a name that is not one
  of this server's (:class:`HostAllowList`) is refused with 403.
- Cross-site requests: a browser sends a POST of ``text/plain``, a form or no type at all
  to any origin without asking it first. A state-changing request (anything but GET,
  HEAD and OPTIONS) must be ``application/json``, which a browser only sends cross-origin
  after a CORS preflight this server never grants: 415 otherwise.

It also bounds what a request may make the driver hold (413 past
``rest.server.max-content-length``: before reading when ``Content-Length`` says so,
while reading a chunked body), and marks every answer as not to be framed by another
page (the dashboard's buttons cancel jobs: clickjacking).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

#: Methods that change nothing: the only ones a body of any type may come with.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: Sent with every answer: no page may frame this server's (clickjacking of the dashboard's
#: buttons), nothing is loaded from elsewhere, and types are not sniffed.
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'self'; "
        b"form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
)


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port, lower case, without a final dot."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0].rstrip(".") if header.count(":") == 1 else header.rstrip(".")


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return False
    return True


class HostAllowList:
    """The names a ``Host`` header may carry: this server's own.

    Always ``localhost`` and any IP address: a browser sends an address in ``Host`` only
    when the page's own origin is that address, which cannot be rebound. Then the bound
    address, ``rest.address``, the machine's names when bound to every interface, and
    ``rest.allowed-hosts`` (``*``: any name). Any port is fine: a forwarded port (``ssh -L``)
    or a proxy changes it, and rebinding does not need another port."""

    def __init__(self, names: Iterable[str], allow_any: bool = False) -> None:
        self.names = frozenset(host_name(name) for name in names if name.strip())
        self.allow_any = allow_any

    @staticmethod
    def of(bind_address: str, address: str | None, configured: str | None) -> HostAllowList:
        names = {"localhost", bind_address}
        if address:
            names.add(address)
        if bind_address in ("0.0.0.0", "::", ""):
            names.update({socket.gethostname(), socket.getfqdn()})
        extra = [name.strip() for name in (configured or "").split(",") if name.strip()]
        return HostAllowList(names | set(extra), allow_any="*" in extra)

    def allows(self, header: str) -> bool:
        if self.allow_any:
            return True
        host = host_name(header)
        return host in self.names or is_ip_address(host)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RequestGuard:
    """ASGI middleware: the Host, content-type and body-size checks, and the security headers."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: HostAllowList, max_content_length: int) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.max_content_length = max_content_length

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        try:
            self._check_head(scope)
            body = await self._read_body(scope, receive)
        except _Refused as refused:
            await self._refuse(scope, send_secured, refused)
            return
        if body is None:  # the client went away
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # http.disconnect, when it comes

        await self.app(scope, replay, send_secured)

    def _check_head(self, scope: Scope) -> None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and not self.allowed_hosts.allows(host):
            raise _Refused(
                403,
                f"Forbidden: '{host_name(host)}' (the request's Host) is not a name of this server; a "
                "web page can reach a local server under a name of its own (DNS rebinding). If clients "
                "reach the driver by this name, add it to rest.allowed-hosts.",
            )
        if scope["method"] not in SAFE_METHODS:
            media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media_type != "application/json":
                raise _Refused(
                    415,
                    f"Unsupported Media Type: {scope['method']} requests must be 'Content-Type: "
                    f"application/json' (got {media_type or 'none'}), as Flink's client sends them.",
                )
        length = headers.get("content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                raise _Refused(400, f"Bad Request: invalid Content-Length {length!r}.") from None
            if size > self.max_content_length:
                raise self._too_large()

    def _too_large(self) -> _Refused:
        return _Refused(
            413,
            f"Request Entity Too Large: the body exceeds {self.max_content_length} bytes "
            "(rest.server.max-content-length).",
        )

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, counted while it arrives; ``None`` if the client disconnected."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_content_length:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, scope: Scope, send: Send, refused: _Refused) -> None:
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client else "an unknown client"
        log.warning(
            "REST request from %s to %s %s refused (%d): %s",
            where,
            scope["method"],
            scope["path"],
            refused.status,
            refused.message,
        )
        body = json.dumps({"errors": [refused.message]}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if refused.status == 413:
            headers.append((b"connection", b"close"))  # the rest of the body is never read
        await send({"type": "http.response.start", "status": refused.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
