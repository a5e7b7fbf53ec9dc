"""The studio's guard, one ASGI middleware in front of every route (``Guard``), and the path rule.

- **Token.** Every request carries the studio's token (as Jupyter's does): in the URL the studio
  prints (``?token=``, then kept in a cookie of this port's own name, HttpOnly, SameSite=Strict),
  or an ``Authorization: token ...`` header. Without it: 403. A bind to another host than
  127.0.0.1 is refused without one (``check_bind``); on 127.0.0.1 it still keeps other users of a
  shared machine out.
- **Host.** On a local bind the ``Host`` header must name this machine's loopback and port: a page
  of another site whose name was re-pointed at 127.0.0.1 (DNS rebinding) is refused.
- **Origin.** A request that changes anything (any method but GET/HEAD) must come from the
  studio's own page: its ``Origin`` (else ``Referer``) is the address it was asked at.
- **Paths.** Files are served only from inside the runs folder (``inside``); files the user
  names (a model folder, a data file) are read by the CLI's own functions, never served.
- **Headers.** No framing, no sniffing, scripts and styles from the studio alone (CSP).
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from xtrain.errors import XtrainError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
SAFE_METHODS = ("GET", "HEAD")
PUBLIC = ("/favicon.ico",)  # what a browser asks for on its own, before any page passed the token
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


def new_token() -> str:
    return secrets.token_urlsafe(24)


def is_local(host: str) -> bool:
    return host.strip("[]").lower() in LOCAL_HOSTS


def check_bind(host: str, token: str | None) -> None:
    """A bind beyond this machine's loopback needs a token: refused in one line without one."""
    if not is_local(host) and not token:
        raise XtrainError(
            f"--host {host} opens the studio to the network, and it has no token",
            "leave out --no-token (the printed URL then carries one), or bind --host 127.0.0.1",
        )


def cookie_name(port: int) -> str:
    """Cookies are shared by every port of a host: each studio's has its port in its name."""
    return f"xtrain-studio-{port}"


def inside(root: Path, relative: str) -> Path:
    """``root / relative`` when it stays inside ``root`` (after resolving ``..`` and links); one
    line otherwise."""
    base = root.resolve()
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise XtrainError(f"{relative} is outside the runs folder", "the studio serves the runs folder only")
    return target


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


class Guard:
    """The middleware: token, host and origin checked before any route runs; the security
    headers on every answer; the token from the URL kept in a cookie."""

    def __init__(self, app: ASGIApp, token: str | None, port: int, local: bool) -> None:
        self.app, self.token, self.port, self.local = app, token, port, local
        self.hosts = {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refused, from_url = self._check(scope, headers)
        if refused is not None:
            await _refuse(send, refused)
            return
        cookie = None
        if from_url and self.token:
            cookie = f"{cookie_name(self.port)}={self.token}; Path=/; HttpOnly; SameSite=Strict"

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [*SECURITY_HEADERS, *([(b"set-cookie", cookie.encode())] if cookie else [])]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, guarded)

    def _check(self, scope: Scope, headers: dict[str, str]) -> tuple[str | None, bool]:
        """(why the request is refused, or None; whether the token came in the URL)."""
        host = headers.get("host", "")
        if self.local and host not in self.hosts:
            return f"this studio answers at 127.0.0.1:{self.port}, not at {host or 'no host'}", False
        if scope["path"] in PUBLIC:
            return None, False
        from_url = False
        if self.token:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = _given_token(headers, query, self.port)
            if given is None or not hmac.compare_digest(given[0].encode(), self.token.encode()):
                return "no valid token: open the URL xtrain studio printed (it carries the token)", False
            from_url = given[1]
        if scope["method"] not in SAFE_METHODS and not _same_origin(headers, host):
            seen = headers.get("origin") or headers.get("referer") or "none"
            return f"a request from another origin ({seen}) may not change anything here", False
        return None, from_url


def _given_token(headers: dict[str, str], query: dict[str, list[str]], port: int) -> tuple[str, bool] | None:
    """(the token the request carries, whether it came in the URL), or None."""
    if query.get("token"):
        return query["token"][0], True
    auth = headers.get("authorization", "")
    if auth.lower().startswith("token "):
        return auth[6:].strip(), False
    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # noqa: BLE001 - a malformed cookie header is no token
        return None
    morsel = jar.get(cookie_name(port))
    return (morsel.value, False) if morsel is not None else None


def _same_origin(headers: dict[str, str], host: str) -> bool:
    """The request's Origin (else Referer) is the studio's own address, as the browser asked it."""
    seen = headers.get("origin") or headers.get("referer")
    if not seen or not host:
        return False
    parts = urlsplit(seen)
    return parts.scheme in ("http", "https") and parts.netloc == host


async def _refuse(send: Send, why: str) -> None:
    body = json.dumps({"error": f"refused: {why}"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 403, "headers": headers + SECURITY_HEADERS})
    await send({"type": "http.response.body", "body": body})
