"""Self-contained HTML pages: assets inlined from the package, data embedded safely.

Every page heapscope writes is one file that works offline: its CSS and JavaScript are read from
``heapscope/web/assets`` at render time and inlined, its data is JSON inside a
``<script type="application/json">`` element, and a Content-Security-Policy forbids any network
access and any script but the page's own (a per-page nonce), so even a symbol name that slipped
into markup could not run. Symbol names come from binaries and JIT maps and may contain
anything: the viewers only ever show them through ``textContent`` or canvas text, and text
heapscope writes into markup itself goes through :func:`markup`.
"""

from __future__ import annotations

import html
import secrets
from importlib import resources
from typing import Any

from heapscope.safetext import json_text
from heapscope.terminal import clean

_TABLE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def asset(name: str) -> str:
    """The text of ``heapscope/web/assets/<name>``."""
    text = resources.files("heapscope.web").joinpath("assets", name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise ValueError(f"asset {name} must not contain a closing script/style tag")
    return text


def script_json(data: Any) -> str:
    """``data`` as JSON that is safe inside ``<script type="application/json">``.

    ``<``, ``>`` and ``&`` can only occur inside JSON strings, where ``\\u003c`` and friends
    mean the same character; so no ``</script>`` or ``<!--`` can end or alter the element.
    The text is ASCII (:func:`heapscope.safetext.json_text`), so U+2028/2029, which old
    JavaScript parsers took for line ends, are escapes too, and undecodable bytes kept as lone
    surrogates are ``\\xNN`` text: the page is valid UTF-8.
    """
    return json_text(data, separators=(",", ":"), allow_nan=False).translate(_TABLE)


def markup(text: str) -> str:
    """``text`` for HTML or SVG markup, element content or a quoted attribute value.

    Control and direction characters, U+FFFE/U+FFFF and undecodable bytes are shown as
    visible escapes (:func:`heapscope.terminal.clean`: XML forbids most of them, and a
    right-to-left override would reorder what the page shows), then ``& < > " '`` become
    character references.
    """
    return html.escape(clean(text), quote=True)


def page(title: str, *, css: list[str], scripts: list[str], body: str,
         data: Any | None = None, data_id: str = "heapscope-data") -> str:
    """A complete HTML document.

    ``body`` is trusted markup written by heapscope (callers escape whatever they put in it);
    ``css`` and ``scripts`` name assets; ``data`` is embedded as JSON for the scripts.
    """
    nonce = secrets.token_urlsafe(18)
    csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
           "img-src data:; base-uri 'none'; form-action 'none'")
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<link rel=\"icon\" href=\"data:,\">\n",
        f"<title>{markup(title)}</title>\n",
    ]
    for name in css:
        parts.append(f"<style nonce=\"{nonce}\">\n{asset(name)}</style>\n")
    parts.append("</head>\n<body>\n")
    parts.append(body)
    if data is not None:
        parts.append(f"<script type=\"application/json\" id=\"{html.escape(data_id)}\">"
                     f"{script_json(data)}</script>\n")
    for name in scripts:
        parts.append(f"<script nonce=\"{nonce}\">\n{asset(name)}</script>\n")
    parts.append("</body>\n</html>\n")
    return "".join(parts)
