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
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from heapscope.analysis.aggregate import GRANULARITIES
from heapscope.analysis.filter import compile_re
from heapscope.analysis.fold import FramePolicy
from heapscope.analysis.graph import GraphOptions
from heapscope.analysis.top import SAMPLE_INDEX, View
from heapscope.errors import HeapscopeError, UsageError
from heapscope.safetext import json_ready
from heapscope.serve.catalog import Dump
from heapscope.serve.views import Target, Workbench
from heapscope.terminal import clean
from heapscope.web import asset

TOKEN_HEADER = "x-heapscope-token"
MAX_ROWS = 100_000
MAX_MERGED = 100  # dumps in one merged set
PATTERNS = ("focus", "ignore", "hide", "show")
DUMP_VIEWS = ("top", "flame", "peek", "source", "graph")
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
    ``ignore``, ``hide``, ``show`` (the names of ``heapscope top``'s options)."""
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
    patterns = {name: q.get(name) or None for name in PATTERNS}
    for name, text in patterns.items():
        if text is not None:
            compile_re(text, name)  # a bad one: 400, naming the parameter
    return View(sample, granularity, q.get("cum") in ("1", "true"), n,
                patterns["focus"], patterns["ignore"], hide=patterns["hide"],
                show=patterns["show"])


def frames_of(request: Request, default: FramePolicy) -> FramePolicy:
    """The frame policy the query asks for: ``own`` and ``alloc_fn`` (each a regular
    expression, repeatable) replace the command line's ``--own`` and ``--alloc-fn`` when
    given, even empty (then there are none)."""
    q = request.query_params

    def given(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        if name not in q:
            return default
        texts = tuple(t for t in q.getlist(name) if t)
        for text in texts:
            compile_re(text, name)
        return texts

    return default._replace(own=given("own", default.own),
                            alloc_fn=given("alloc_fn", default.alloc_fn))


def _fraction(text: str | None, name: str, default: float) -> float:
    try:
        v = float(text) if text else default
    except ValueError:
        raise UsageError(f"{name} must be a number") from None
    if not 0.0 <= v < 1.0:
        raise UsageError(f"{name} must be at least 0 and below 1")
    return v


def graph_options_of(request: Request, view: View) -> GraphOptions:
    """The call graph the query asks for: the view's sample, granularity and patterns, and
    ``nodecount``, ``nodefraction``, ``edgefraction`` (``heapscope graph``'s, and its
    defaults)."""
    q = request.query_params
    defaults = GraphOptions()
    try:
        nodecount = int(q.get("nodecount") or defaults.nodecount)
    except ValueError:
        raise UsageError("nodecount must be a whole number") from None
    if not 0 <= nodecount <= MAX_ROWS:
        raise UsageError(f"nodecount must be 0 (no limit) to {MAX_ROWS}")
    return GraphOptions(view.sample, view.granularity, nodecount,
                        _fraction(q.get("nodefraction"), "nodefraction",
                                  defaults.nodefraction),
                        _fraction(q.get("edgefraction"), "edgefraction",
                                  defaults.edgefraction),
                        view.focus, view.ignore, view.hide, view.show)


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

    def merged_of(request: Request) -> list[Dump]:
        ids = [t.strip() for t in (request.query_params.get("ids") or "").split(",")]
        if not any(ids):
            raise UsageError("a merged set needs ids=ID,ID,…")
        dumps = list({d.id: d for d in (dump_of(t) for t in ids if t)}.values())
        if len(dumps) > MAX_MERGED:
            raise UsageError(f"a merged set holds at most {MAX_MERGED} dumps")
        return dumps

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
        doc = catalog.as_dict()
        frames = bench.settings.frames
        doc["frames"] = {"own": list(frames.own), "alloc_fn": list(frames.alloc_fn)}
        return JSONAnswer(doc)

    def version(request: Request) -> Response:
        return JSONAnswer({"version": catalog.refresh()})

    def shape(request: Request, target: Target, what: str) -> Any:
        """The view ``what`` of ``target``, as the query shapes it."""
        view = view_of(request)
        q = request.query_params
        if what == "top":
            return bench.top(target, view)
        if what == "flame":
            return bench.flame(target, view)
        if what == "graph":
            return bench.graph(target, graph_options_of(request, view))
        if what == "peek":
            name = q.get("function")
            if not name:
                raise UsageError("peek needs function=NAME")
            return bench.peek(target, view, name)
        if what == "source":
            file = q.get("file")
            if not file:
                raise UsageError("source needs file=NAME (a file the profile names)")
            doc = bench.source(target, view, file)
            if doc is None:
                raise LookupError("the profile names no such file")
            return doc
        raise LookupError(f"no view {what}")

    def of_target(request: Request, dumps: Callable[[], Sequence[Dump]]) -> Response:
        """The answer of a view (the path's ``view``) of ``dumps``."""
        def make() -> Any:
            what = request.path_params["view"]
            if what not in DUMP_VIEWS:
                raise LookupError(f"no view {what}")
            target = Target(tuple(dumps()), base_of(request),
                            frames_of(request, bench.settings.frames))
            return shape(request, target, what)
        return answer(make)

    def one_dump(request: Request) -> Response:
        return of_target(request, lambda: [dump_of(request.path_params["id"])])

    def merged(request: Request) -> Response:
        return of_target(request, lambda: merged_of(request))

    def input_of(request: Request) -> int:
        i = number(request.path_params["id"], "session")
        try:
            catalog.input(i)
        except KeyError:
            raise LookupError(f"no session {i}") from None
        return i

    def leaks(request: Request) -> Response:
        return answer(lambda: bench.leaks(input_of(request),
                                          frames_of(request, bench.settings.frames)))

    def timeline(request: Request) -> Response:
        return answer(lambda: bench.timeline(input_of(request),
                                             frames_of(request, bench.settings.frames)))

    def diff(request: Request) -> Response:
        q = request.query_params
        return answer(lambda: bench.top(
            Target((dump_of(q.get("b"), "dump b"),), dump_of(q.get("a"), "dump a"),
                   frames_of(request, bench.settings.frames)), view_of(request)))

    routes = [
        Route("/", index),
        Route("/api/inputs", inputs),
        Route("/api/version", version),
        Route("/api/dump/{id}/{view}", one_dump),
        Route("/api/merged/{view}", merged),
        Route("/api/session/{id}/leaks", leaks),
        Route("/api/session/{id}/timeline", timeline),
        Route("/api/diff", diff),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Guard, token=token)])
