"""Reader for pprof's profile.proto (gzipped or not), through the classes generated from
``formats/proto/profile.proto``.

:func:`parse_profile` gives the message; :func:`decode_profile` the same as nested dicts
named as in the proto (``sample_type``, ``sample``, ``mapping``, ``location``, ``function``,
``string_table``, …), for tests and scripts that check exported profiles.
"""

from __future__ import annotations

import zlib
from typing import Any

from google.protobuf.message import DecodeError, Message

from heapscope.errors import InputError
from heapscope.formats.load import gunzip
from heapscope.formats.proto import profile_pb2


def parse_profile(data: bytes) -> profile_pb2.Profile:
    """profile.proto bytes (gzipped or not) as a message; ValueError when they are not."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gunzip(data, "profile")
        except (OSError, EOFError, zlib.error, InputError) as e:
            raise ValueError(f"corrupt or oversized gzip data ({e})") from None
    msg = profile_pb2.Profile()
    try:
        msg.ParseFromString(data)
    except (DecodeError, RecursionError) as e:
        raise ValueError(f"not a profile.proto message ({e})") from None
    return msg


def _to_dict(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if f.message_type is not None:
            if f.is_repeated:
                out[f.name] = [_to_dict(m) for m in value]
            else:
                out[f.name] = _to_dict(value) if msg.HasField(f.name) else None
        elif f.is_repeated:
            out[f.name] = [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v
                           for v in value]
        else:
            out[f.name] = value
    return out


def decode_profile(data: bytes) -> dict[str, Any]:
    """Decode profile.proto bytes (gzipped or not) into nested dicts named as in the proto."""
    return _to_dict(parse_profile(data))
