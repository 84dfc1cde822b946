"""The whole profile model as JSON, for scripts.

Shape (``format: heapscope-profile``, ``version: 1``)::

    {"meta": {"format", "version", "sources", "pids", "period", "sampling", "unsampled",
              "sample_types": [{"type", "unit"}], "threads": [{"id", "name"}]},
     "mappings":  [{"id", "start", "limit", "offset", "path", "perms", "build_id"}],
     "locations": [{"id", "address", "mapping", "module", "offset",
                    "frames": [{"function", "file", "line", "inlined", "full_name",
                                "system_name"}]}],
     "samples":   [{"stack": [frame names, leaf first, inlined frames included],
                    "locations": [location ids, leaf first],
                    "values": {"inuse_objects": …, "inuse_space": …, …},
                    "threads": [{"id", "values": {…}}]}]}

Values are the unsampled estimates (floats). ``mapping`` is a mapping id or null; ids are
dense from 1. Several profiles (``--merge``) share one list of mappings and locations, each
location keyed by its mapping, address and frames.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TextIO

from heapscope.errors import InputError
from heapscope.model import Frame, Mapping, Profile, wide_address
from heapscope.render.collapsed import frame_names
from heapscope.safetext import json_text
from heapscope.units import short_number

FORMAT = "heapscope-profile"
VERSION = 1


def _frame(f: Frame) -> dict[str, Any]:
    return {"function": f.function, "file": f.file, "line": f.line, "inlined": f.inlined,
            "full_name": f.full_name, "system_name": f.system_name}


def profile_dict(profiles: Iterable[Profile], *, threads: bool = True) -> dict[str, Any]:
    """The JSON document for the sum of ``profiles`` (samples are listed, not merged)."""
    profiles = list(profiles)
    mapping_ids: dict[Mapping, int] = {}
    mappings: list[dict[str, Any]] = []
    location_ids: dict[tuple[int, int, tuple[Frame, ...]], int] = {}
    locations: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    thread_names: dict[int, str] = {}
    first = profiles[0] if profiles else Profile(())
    type_names = [vt.type for vt in first.sample_types]

    def mapping_id(m: Mapping) -> int:
        i = mapping_ids.get(m)
        if i is None:
            i = mapping_ids[m] = len(mappings) + 1
            mappings.append({"id": i, "start": m.start, "limit": m.limit, "offset": m.offset,
                             "path": m.path, "perms": m.perms, "build_id": m.build_id})
        return i

    for p in profiles:
        wide = wide_address(p)
        if wide is not None:
            # As pprof export says it: one line naming the dump, never a traceback from
            # json (a number past 4,300 digits) or a document other readers cannot take.
            raise InputError(p.source or "the profile",
                             f"address {short_number(wide, hexadecimal=True)} does not fit in "
                             "64 bits (a damaged dump?)")
        for m in p.mappings:
            mapping_id(m)
        for t in p.threads:
            thread_names.setdefault(t.id, t.name)
        loc_ids: dict[int, int] = {}
        names: dict[int, tuple[str, ...]] = {}
        for a in sorted(p.addresses()):
            loc = p.location(a)
            mid = mapping_id(loc.mapping) if loc.mapping is not None else 0
            key = (mid, a, loc.frames)
            i = location_ids.get(key)
            if i is None:
                i = location_ids[key] = len(locations) + 1
                locations.append({
                    "id": i, "address": a, "mapping": mid or None, "module": loc.module,
                    "offset": loc.offset, "frames": [_frame(f) for f in loc.frames],
                })
            loc_ids[a] = i
            names[a] = frame_names(loc)
        for s in p.samples:
            stack: list[str] = []
            for a in s.stack:
                stack.extend(names[a])
            d: dict[str, Any] = {
                "stack": stack,
                "locations": [loc_ids[a] for a in s.stack],
                "values": dict(zip(type_names, s.values, strict=False)),
            }
            if threads and s.threads:
                d["threads"] = [{"id": t.thread,
                                 "values": dict(zip(type_names, t.values, strict=False))}
                                for t in s.threads]
            samples.append(d)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "sources": [p.source for p in profiles],
        "pids": [p.pid for p in profiles],
        "period": first.period,
        "sampling": first.sampling,
        "unsampled": all(p.unsampled for p in profiles),
        "sample_types": [{"type": vt.type, "unit": vt.unit} for vt in first.sample_types],
        "threads": [{"id": k, "name": v} for k, v in sorted(thread_names.items())],
    }
    return {"meta": meta, "mappings": mappings, "locations": locations, "samples": samples}


def render_profile_json(out: TextIO, profiles: Iterable[Profile]) -> None:
    """Write the profile document as compact JSON (one object, newline-terminated): ASCII,
    undecodable bytes of names and paths as ``\\xNN`` text (:func:`json_text`)."""
    out.write(json_text(profile_dict(profiles), separators=(",", ":")))
    out.write("\n")
