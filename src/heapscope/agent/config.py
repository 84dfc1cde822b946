"""The agent's settings: a TOML file (``heapscope agent --config FILE``) and the flags.

A flag given on the command line wins over the file. On SIGHUP the file is read again and
what can change while running does (targets, ``every``, ``window``, ``top``, the disk
limits); ``listen``, ``state`` and ``pyroscope`` need a restart. Example::

    every = 30
    window = 40
    listen = "127.0.0.1:9464"
    state = "/var/lib/heapscope/agent"
    max_disk = "2G"
    pyroscope = "http://pyroscope.internal:4040"
    parca = "http://parca.internal:7070"
    tls_cert = "/etc/heapscope/agent.crt"  # serve /metrics over HTTPS
    tls_key = "/etc/heapscope/agent.key"
    tls_client_ca = "/etc/heapscope/scrapers-ca.crt"  # and only to clients it signed

    [[target]]
    match = "postgres: .* (idle|active)"   # a command-line pattern
    [[target]]
    unit = "slapd"                          # a systemd service's main process
    [[target]]
    pid = 4242
    [[target]]
    pidfile = "/run/nginx.pid"              # read again every round
    [[target]]
    dumps = "/var/lib/heapscope/myapp"      # dumps a service writes itself (no attach)
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from heapscope.errors import InputError
from heapscope.files import open_regular
from heapscope.units import parse_size

#: Settings that only take effect when the agent starts.
AT_START = ("listen", "state", "pyroscope", "parca", "push_queue", "tls_cert", "tls_key",
            "tls_client_ca")


@dataclass
class Settings:
    """Everything the agent runs with."""

    pids: list[int] = field(default_factory=list)
    matches: list[str] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    pidfiles: list[str] = field(default_factory=list)
    every: float = 60.0
    window: int = 30
    top: int = 10
    listen: str = "127.0.0.1:9464"
    state: str = "/var/lib/heapscope/agent"
    max_disk: int = 1 << 30
    min_free: int = 256 << 20
    pyroscope: str = ""
    parca: str = ""
    push_queue: int = 64
    timeout: float = 30.0
    active: float = 0.0
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""

    def problems(self) -> list[str]:
        """What makes these settings unusable (empty when they are fine)."""
        out = []
        if not (self.pids or self.matches or self.units or self.folders or self.pidfiles):
            out.append("nothing to watch: give --pid, --pidfile, --match, --unit or --dumps "
                       "(or [[target]])")
        if not 0 <= self.active < self.every:
            out.append("active must be at least 0 and less than every")
        times = (self.every, self.timeout, self.active)
        if not all(math.isfinite(t) for t in times):
            out.append("every, timeout and active must be finite numbers of seconds")
        elif self.every > MAX_SECONDS or self.timeout > MAX_SECONDS:
            out.append(f"every and timeout must be at most {MAX_SECONDS:g} s (a day)")
        if not self.timeout > 0:
            out.append("timeout must be positive")
        if self.every <= 0 or self.window < 2 or self.top < 1 or self.push_queue < 1:
            out.append("every must be positive, window at least 2, top and push_queue at "
                       "least 1")
        for m in self.matches:
            try:
                re.compile(m)
            except re.error as e:
                out.append(f"match {m!r}: {e}")
        if bool(self.tls_cert) != bool(self.tls_key):
            out.append("tls_cert and tls_key go together (a certificate and its key)")
        if self.tls_client_ca and not self.tls_cert:
            out.append("tls_client_ca needs tls_cert and tls_key (client certificates are "
                       "checked over TLS)")
        for name in ("pyroscope", "parca"):
            url = getattr(self, name)
            if url and not url.startswith(("http://", "https://")):
                out.append(f"{name} {url}: give an http:// or https:// URL")
        return out


MAX_SECONDS = 86400.0  # every and timeout: a day at most (sleep() refuses far larger values)

_SCALARS = {f.name: f.type for f in fields(Settings)}
_LISTS = ("pids", "matches", "units", "folders", "pidfiles")


def _scalar(path: str, key: str, value: Any) -> Any:
    if key in ("max_disk", "min_free"):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_size(value, key)
    elif key in ("every", "timeout", "active"):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif key in ("window", "top", "push_queue"):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, str):
        return value
    raise InputError(path, f"{key} = {value!r} has the wrong type")


def load(path: str) -> dict[str, Any]:
    """The settings a config file gives, as field name -> value (only those it names)."""
    try:
        with open_regular(path) as f:
            doc = tomllib.loads(f.read(1 << 20).decode("utf-8"))
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(path, f"not valid TOML: {e}") from None
    out: dict[str, Any] = {k: [] for k in _LISTS}
    for key, value in doc.items():
        if key == "target":
            if not isinstance(value, list):
                raise InputError(path, "target must be a list of [[target]] tables")
            for t in value:
                _target(path, t, out)
        elif key in _SCALARS and key not in _LISTS:
            out[key] = _scalar(path, key, value)
        else:
            raise InputError(path, f"unknown setting {key!r}")
    return out


def _target(path: str, t: Any, out: dict[str, Any]) -> None:
    if not isinstance(t, dict) or len(t) != 1:
        raise InputError(path, "each [[target]] names one of pid, pidfile, match, unit or "
                               "dumps")
    (kind, value), = t.items()
    if kind == "pid" and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        out["pids"].append(value)
    elif kind == "match" and isinstance(value, str):
        out["matches"].append(value)
    elif kind == "unit" and isinstance(value, str):
        out["units"].append(value)
    elif kind == "dumps" and isinstance(value, str):
        out["folders"].append(value)
    elif kind == "pidfile" and isinstance(value, str):
        out["pidfiles"].append(value)
    else:
        raise InputError(path, f"[[target]] {kind} = {value!r}: want pid = N, pidfile = "
                               "\"PATH\", match = \"REGEX\", unit = \"NAME\" or dumps = "
                               "\"DIR\"")


def merge(from_file: dict[str, Any], from_flags: dict[str, Any]) -> Settings:
    """Settings from the file, then the flags given on the command line (they win; target
    lists from both are joined)."""
    s = Settings()
    for source in (from_file, from_flags):
        for key, value in source.items():
            if value is None:
                continue
            if key in _LISTS:
                getattr(s, key).extend(value)
            else:
                setattr(s, key, value)
    return s
