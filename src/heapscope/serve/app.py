"""The viewer's web application: one page and the JSON endpoints it (and scripts) read.

Every request must carry the server's token: in the URL the server printed (``?token=``; the
page then gets it as a cookie and sheds it from the address bar), in the cookie, or in an
``X-Heapscope-Token`` header (scripts). Without it: 403, whatever the path. No CORS headers
are ever sent, so other web pages cannot read the answers; every answer forbids framing and
sniffing and asks not to be cached, and the page's Content-Security-Policy allows only its
own inline code (a fresh nonce each time) and requests to this server.

Dumps and inputs are named by their numbers in the :class:`~heapscope.serve.catalog.Catalog`;
no path from a request is ever opened (the source view looks the file up in the profile).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from heapscope.analysis.aggregate import GRANULARITIES
from heapscope.analysis.top import SAMPLE_INDEX, View
from heapscope.errors import HeapscopeError, UsageError
from heapscope.safetext import json_ready
from heapscope.serve.catalog import Dump
from heapscope.serve.views import Workbench
from heapscope.terminal import clean
from heapscope.web import asset

TOKEN_HEADER = "x-heapscope-token"
MAX_ROWS = 100_000
_JSON_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def cookie_name(token: str) -> str:
    """The cookie that carries ``token``: named after it, so two servers on one host (cookies
    do not tell ports apart) keep their own."""
    return "heapscope_" + hashlib.sha256(token.encode()).hexdigest()[:10]


def _page(nonce: str) -> str:
    """The viewer's HTML: its markup, styles and scripts inlined (nothing fetched)."""
    own = resources.files("heapscope.serve").joinpath("assets")
    body = own.joinpath("index.html").read_text(encoding="utf-8")
    css = own.joinpath("viewer.css").read_text(encoding="utf-8")
    js = own.joinpath("viewer.js").read_text(encoding="utf-8")
    for text in (css, js):
        if "</script" in text.lower() or "</style" in text.lower():
            raise ValueError("a viewer asset holds a closing script or style tag")
    return (body.replace("{{nonce}}", nonce)
            .replace("{{style}}", css)
            .replace("{{flamegraph}}", asset("flamegraph.js"))
            .replace("{{viewer}}", js))


def page_csp(nonce: str) -> str:
    """The page's policy: its own inline code only, requests to this server only."""
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


class JSONAnswer(Response):
    """JSON as the endpoints write it: UTF-8, no NaN; undecodable bytes as ``\\xNN`` text."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            return json.dumps(content, ensure_ascii=False, allow_nan=False,
                              separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: bytes of a name that is not UTF-8
            return json.dumps(json_ready(content), ensure_ascii=False, allow_nan=False,
                              separators=(",", ":")).encode("utf-8")


def _error(status: int, message: str) -> JSONAnswer:
    return JSONAnswer({"error": clean(message)}, status_code=status)


class Guard(BaseHTTPMiddleware):
    """The token check and the headers every answer carries."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token.encode()
        self.cookie = cookie_name(token)

    def _allowed(self, request: Request) -> bool:
        for given in (request.headers.get(TOKEN_HEADER), request.cookies.get(self.cookie),
                      request.query_params.get("token")):
            if given is not None and secrets.compare_digest(given.encode(), self.token):
                return True
        return False

    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if not self._allowed(request):
            response: Response = _error(403, "this heapscope server answers only with the "
                                             "token of the URL it printed")
        elif request.url.path == "/" and "token" in request.query_params:
            # Trade the token in the address bar for a cookie only this server's pages send.
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(self.cookie, self.token.decode(), httponly=True,
                                samesite="strict", path="/")
        else:
            response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", _JSON_CSP)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        response.headers["Cross-Origin-Resource-Policy"] = "same-origin"
        return response


def view_of(request: Request) -> View:
    """The view the query asks for: ``sample``, ``granularity``, ``cum``, ``n``, ``focus``,
    ``ignore`` (the names of ``heapscope top``'s options)."""
    q = request.query_params
    sample = q.get("sample") or "inuse_space"
    if sample not in SAMPLE_INDEX:
        raise UsageError(f"sample must be one of {', '.join(SAMPLE_INDEX)}")
    granularity = q.get("granularity") or "functions"
    if granularity not in GRANULARITIES:
        raise UsageError(f"granularity must be one of {', '.join(GRANULARITIES)}")
    try:
        n = int(q.get("n") or "100")
    except ValueError:
        raise UsageError("n must be a whole number") from None
    if not 0 <= n <= MAX_ROWS:
        raise UsageError(f"n must be 0 (all) to {MAX_ROWS}")
    return View(sample, granularity, q.get("cum") in ("1", "true"), n,
                q.get("focus") or None, q.get("ignore") or None)


def create_app(bench: Workbench, token: str) -> Starlette:
    """The application serving ``bench``'s views to whoever holds ``token``."""
    catalog = bench.catalog

    def number(text: str | None, what: str) -> int:
        try:
            return int(text or "")
        except ValueError:
            raise UsageError(f"{what} must be a number") from None

    def dump_of(text: str | None, what: str = "dump") -> Dump:
        try:
            return catalog.dump(number(text, what))
        except KeyError:
            raise LookupError(f"no {what} {text}") from None

    def base_of(request: Request) -> Dump | None:
        base = request.query_params.get("base")
        return dump_of(base, "base") if base else None

    def answer(make: Callable[[], Any]) -> Response:
        try:
            doc = make()
        except LookupError as e:
            return _error(404, str(e).strip("'\""))
        except UsageError as e:
            return _error(400, str(e))
        except HeapscopeError as e:
            return _error(422, str(e))
        if doc is None:
            return _error(404, "not found")
        return JSONAnswer(doc)

    def index(request: Request) -> Response:
        nonce = secrets.token_urlsafe(18)
        response = HTMLResponse(_page(nonce))
        response.headers["Content-Security-Policy"] = page_csp(nonce)
        return response

    def inputs(request: Request) -> Response:
        catalog.refresh()
        return JSONAnswer(catalog.as_dict())

    def version(request: Request) -> Response:
        return JSONAnswer({"version": catalog.refresh()})

    def top(request: Request) -> Response:
        return answer(lambda: bench.top(dump_of(request.path_params["id"]), view_of(request),
                                        base_of(request)))

    def flame(request: Request) -> Response:
        return answer(lambda: bench.flame(dump_of(request.path_params["id"]),
                                          view_of(request), base_of(request)))

    def peek(request: Request) -> Response:
        def make() -> Any:
            name = request.query_params.get("function")
            if not name:
                raise UsageError("peek needs function=NAME")
            return bench.peek(dump_of(request.path_params["id"]), view_of(request), name,
                              base_of(request))
        return answer(make)

    def source(request: Request) -> Response:
        def make() -> Any:
            file = request.query_params.get("file")
            if not file:
                raise UsageError("source needs file=NAME (a file the profile names)")
            doc = bench.source(dump_of(request.path_params["id"]), view_of(request), file,
                               base_of(request))
            if doc is None:
                raise LookupError("the profile names no such file")
            return doc
        return answer(make)

    def input_of(request: Request) -> int:
        i = number(request.path_params["id"], "session")
        try:
            catalog.input(i)
        except KeyError:
            raise LookupError(f"no session {i}") from None
        return i

    def leaks(request: Request) -> Response:
        return answer(lambda: bench.leaks(input_of(request)))

    def timeline(request: Request) -> Response:
        return answer(lambda: bench.timeline(input_of(request)))

    def diff(request: Request) -> Response:
        q = request.query_params
        return answer(lambda: bench.top(dump_of(q.get("b"), "dump b"), view_of(request),
                                        dump_of(q.get("a"), "dump a")))

    routes = [
        Route("/", index),
        Route("/api/inputs", inputs),
        Route("/api/version", version),
        Route("/api/dump/{id}/top", top),
        Route("/api/dump/{id}/flame", flame),
        Route("/api/dump/{id}/peek", peek),
        Route("/api/dump/{id}/source", source),
        Route("/api/session/{id}/leaks", leaks),
        Route("/api/session/{id}/timeline", timeline),
        Route("/api/diff", diff),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Guard, token=token)])
