"""Bearer-token authentication of the REST API.

Flink's REST API has no authentication: it trusts the network. A chandy driver
may run anywhere Spark puts it, so chandy refuses to serve its control port
(cancel, stop, savepoint) on anything but loopback without ``rest.auth.token``,
and with a token every request must carry ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import socket
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from chandy.errors import ConfigurationError

log = logging.getLogger(__name__)


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP or a host name) only listens on this machine."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(address, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


#: The shortest token accepted: one a client cannot guess by trying (16 characters of
#: ``secrets.token_urlsafe`` are 96 bits).
MIN_TOKEN_LENGTH = 16

#: Where a client asks a server to prove it holds the token, without sending it; served
#: without the token (under ``/v1`` too).
IDENTITY_PATH = "/chandy/identity"

_PROOF_CONTEXT = b"chandy-rest-identity:"


def check_token(token: str) -> None:
    """Refuse a token that is easy to guess or can never match.

    The API compares the token a client presents with surrounding whitespace removed (an
    HTTP header's is), so a token of spaces, or one that begins or ends with a space, would
    be accepted here and then refuse every client."""
    problem = None
    if token != token.strip():
        problem = (
            "it begins or ends with whitespace (which no HTTP header carries), so no client could match it"
        )
    elif len(token) < MIN_TOKEN_LENGTH:
        problem = (
            f"it has {len(token)} characters: at least {MIN_TOKEN_LENGTH} are required, so it cannot "
            "be guessed"
        )
    if problem is not None:
        raise ConfigurationError(
            f"rest.auth.token is refused: {problem}. Generate one with: python -c "
            '"import secrets; print(secrets.token_urlsafe(32))"'
        )


def token_proof(token: str, nonce: str) -> str:
    """What a server holding ``token`` answers to a client's ``nonce``: proof that it holds
    the token, which tells the client nothing about it (HMAC-SHA256)."""
    return hmac.new(token.encode(), _PROOF_CONTEXT + nonce.encode(), hashlib.sha256).hexdigest()


def check_exposure(bind_address: str, token: str | None) -> None:
    """Refuse to serve an open control port (anything but loopback needs a token), and a
    token that is weak or can never match (:func:`check_token`)."""
    if token:
        check_token(token)
        return
    if not is_loopback(bind_address):
        raise ConfigurationError(
            f"rest.bind-address is '{bind_address}', which is not loopback, and rest.auth.token is not "
            "set: chandy does not serve a REST API that can cancel and stop jobs to the network "
            "without authentication. Set rest.auth.token (clients then send 'Authorization: Bearer "
            "<token>'), or bind to 127.0.0.1 (the default), or disable the server with "
            "chandy.rest.enabled: false."
        )


class BearerTokenAuth:
    """ASGI middleware: 401 with Flink's error body, logged, for a request without the token.

    The dashboard's own files (under ``public_dir``) are served without it: they hold no
    job data, and a browser cannot send a header when it first loads a page; the page
    then asks for the token and sends it with every API call. So is :data:`IDENTITY_PATH`,
    which a client asks before it sends the token (see :func:`token_proof`)."""

    def __init__(self, app: ASGIApp, token: str, public_dir: Path | None = None) -> None:
        self.app = app
        self._token = token.encode()
        self._public_dir = public_dir.resolve() if public_dir is not None else None

    def _is_public(self, scope: Scope) -> bool:
        if scope["method"] not in ("GET", "HEAD"):
            return False
        path: str = scope["path"]
        if path in (IDENTITY_PATH, "/v1" + IDENTITY_PATH):
            return True
        if self._public_dir is None:
            return False
        if path == "/":
            return True
        candidate = (self._public_dir / path.lstrip("/")).resolve()
        return candidate.is_relative_to(self._public_dir) and candidate.is_file()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._is_public(scope):
            await self.app(scope, receive, send)
            return
        scheme, _, presented = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), self._token):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client else "an unknown client"
        reason = "a wrong token" if scheme.lower() == "bearer" else "no bearer token"
        log.warning(
            "REST request from %s to %s %s refused: %s.", where, scope["method"], scope["path"], reason
        )
        body = json.dumps(
            {"errors": ["Unauthorized: this API requires 'Authorization: Bearer <token>' (rest.auth.token)."]}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="chandy"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
