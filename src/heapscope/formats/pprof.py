"""Reader for pprof's profile.proto (gzipped or not): the messages heapscope writes.

Decodes into nested dicts named as in the proto (``sample_type``, ``sample``, ``mapping``,
``location``, ``function``, ``string_table``, …), for tests and scripts that check exported
profiles without a protobuf dependency.
"""

from __future__ import annotations

import zlib
from typing import Any

from heapscope.errors import InputError
from heapscope.formats.load import gunzip

_VARINT = 0  # protobuf wire types
_LEN = 2


def read_fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one message: ints for varints, bytes for LEN."""
    out: list[tuple[int, int | bytes]] = []
    i, n = 0, len(data)
    while i < n:
        key, i = _read_varint(data, i)
        field_no, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, i = _read_varint(data, i)
            out.append((field_no, value))
        elif wire == _LEN:
            size, i = _read_varint(data, i)
            if i + size > n:
                raise ValueError("truncated length-delimited field")
            out.append((field_no, data[i : i + size]))
            i += size
        elif wire == 1:
            out.append((field_no, int.from_bytes(data[i : i + 8], "little")))
            i += 8
        elif wire == 5:
            out.append((field_no, int.from_bytes(data[i : i + 4], "little")))
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def _packed(value: int | bytes) -> list[int]:
    if isinstance(value, int):
        return [value]
    out = []
    i = 0
    while i < len(value):
        v, i = _read_varint(value, i)
        out.append(v)
    return out


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


_SCHEMA: dict[str, dict[int, tuple[str, str]]] = {
    # field number -> (name, kind): int | bool | bytes (text) | packed | int64s | msg:NAME
    "Profile": {
        1: ("sample_type", "msg:ValueType"), 2: ("sample", "msg:Sample"),
        3: ("mapping", "msg:Mapping"), 4: ("location", "msg:Location"),
        5: ("function", "msg:Function"), 6: ("string_table", "bytes"),
        7: ("drop_frames", "int"), 8: ("keep_frames", "int"), 9: ("time_nanos", "int"),
        10: ("duration_nanos", "int"), 11: ("period_type", "msg:ValueType"),
        12: ("period", "int"), 13: ("comment", "packed"), 14: ("default_sample_type", "int"),
    },
    "ValueType": {1: ("type", "int"), 2: ("unit", "int")},
    "Sample": {1: ("location_id", "packed"), 2: ("value", "int64s"), 3: ("label", "msg:Label")},
    "Label": {1: ("key", "int"), 2: ("str", "int"), 3: ("num", "int"), 4: ("num_unit", "int")},
    "Mapping": {
        1: ("id", "int"), 2: ("memory_start", "int"), 3: ("memory_limit", "int"),
        4: ("file_offset", "int"), 5: ("filename", "int"), 6: ("build_id", "int"),
        7: ("has_functions", "bool"), 8: ("has_filenames", "bool"),
        9: ("has_line_numbers", "bool"), 10: ("has_inline_frames", "bool"),
    },
    "Location": {
        1: ("id", "int"), 2: ("mapping_id", "int"), 3: ("address", "int"),
        4: ("line", "msg:Line"), 5: ("is_folded", "bool"),
    },
    "Line": {1: ("function_id", "int"), 2: ("line", "int"), 3: ("column", "int")},
    "Function": {
        1: ("id", "int"), 2: ("name", "int"), 3: ("system_name", "int"),
        4: ("filename", "int"), 5: ("start_line", "int"),
    },
}
_REPEATED = {
    ("Profile", n) for n in ("sample_type", "sample", "mapping", "location", "function",
                             "string_table", "comment")
} | {("Sample", "location_id"), ("Sample", "value"), ("Sample", "label"), ("Location", "line")}


def _decode(data: bytes, kind: str) -> dict[str, Any]:
    schema = _SCHEMA[kind]
    out: dict[str, Any] = {}
    for name, how in schema.values():
        if (kind, name) in _REPEATED:
            out[name] = []
        elif how.startswith("msg:"):
            out[name] = None
        else:
            out[name] = False if how == "bool" else 0
    for field_no, value in read_fields(data):
        if field_no not in schema:
            continue
        name, how = schema[field_no]
        decoded: Any
        if how.startswith("msg:"):
            if not isinstance(value, bytes):
                raise ValueError(f"{kind}.{name}: expected a message")
            decoded = _decode(value, how[4:])
        elif how == "bytes":
            if not isinstance(value, bytes):
                raise ValueError(f"{kind}.{name}: expected bytes")
            decoded = value.decode("utf-8", "surrogateescape")
        elif how in ("packed", "int64s"):
            vals = _packed(value)
            out[name].extend([_int64(v) for v in vals] if how == "int64s" else vals)
            continue
        elif isinstance(value, int):
            decoded = bool(value) if how == "bool" else _int64(value)
        else:
            raise ValueError(f"{kind}.{name}: expected a varint")
        if (kind, name) in _REPEATED:
            out[name].append(decoded)
        else:
            out[name] = decoded
    return out


def decode_profile(data: bytes) -> dict[str, Any]:
    """Decode profile.proto bytes (gzipped or not) into nested dicts named as in the proto."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gunzip(data, "profile")
        except (OSError, EOFError, zlib.error, InputError) as e:
            raise ValueError(f"corrupt or oversized gzip data ({e})") from None
    return _decode(data, "Profile")
