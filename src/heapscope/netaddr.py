"""Listening addresses: whether one can be reached only from this machine."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True when a server listening on ``host`` is reachable from this machine only:
    ``localhost`` or a loopback address (IPv6 in brackets or not). An empty host (every
    interface) or any other name is not: a name may resolve to anything."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
