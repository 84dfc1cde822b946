"""Call trees for flame graphs: stacks merged by the path of frame names.

The tree runs from a synthetic root through every frame of a stack, outermost caller first, to
the allocating frame (``invert=True`` builds it the other way round: root, allocating frame,
its callers). Inlined frames are nodes of their own. Two stacks share a node when the names
on the path to it are the same, whatever addresses, modules or processes they came from; so
trees of different dumps (a base and a new one) line up by name.

Each node carries the four heap values (inuse objects/bytes, alloc objects/bytes) and, for a
diff, the base profile's four values as well. :func:`CallTree.to_json` writes the tree
compactly: one string table for names, files and modules, and the nodes as parallel integer
arrays, so the size grows with the number of distinct frames, not with the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from heapscope.analysis.fold import FramePolicy, frame_kinds
from heapscope.model import HEAP_SAMPLE_TYPES, Location, Profile
from heapscope.native import core

ROOT_NAME = "all"
NVALUES = len(HEAP_SAMPLE_TYPES)

# One frame as the tree sees it: (name, file, line, module, inlined).
FrameKey = tuple[str, str, int, str, bool]
# Whose code a node is (see analysis.classify); "" when not classified.
KINDS = ("", "own", "library", "dependency", "wrapper")
_KIND_ID = {k: i for i, k in enumerate(KINDS)}


@dataclass
class CallTree:
    """Nodes in creation order (a parent always precedes its children); node 0 is the root.

    ``line[k]`` is 0 when the frames merged into node ``k`` disagree on the line (one function
    called from several lines of the same caller), so the tooltip never shows a wrong line.
    """

    inverted: bool = False
    strings: list[str] = field(default_factory=lambda: [""])
    parent: list[int] = field(default_factory=lambda: [-1])
    name: list[int] = field(default_factory=lambda: [0])
    file: list[int] = field(default_factory=lambda: [0])
    line: list[int] = field(default_factory=lambda: [0])
    module: list[int] = field(default_factory=lambda: [0])
    inlined: list[bool] = field(default_factory=lambda: [False])
    kind: list[int] = field(default_factory=lambda: [0])  # index into KINDS
    values: list[list[float]] = field(default_factory=lambda: [[0.0] for _ in range(NVALUES)])
    base: list[list[float]] | None = None
    _ids: dict[str, int] = field(default_factory=lambda: {"": 0}, repr=False)
    _children: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.name == [0] and self.strings == [""]:
            self.name[0] = self.intern(ROOT_NAME)

    def __len__(self) -> int:
        return len(self.parent)

    def intern(self, text: str) -> int:
        """The string table index of ``text``, adding it when new."""
        k = self._ids.get(text)
        if k is None:
            k = self._ids[text] = len(self.strings)
            self.strings.append(text)
        return k

    def child(self, parent: int, frame: FrameKey, kind: int = 0) -> int:
        """The node for ``frame`` under ``parent`` (``kind``: an index into KINDS), created
        when new."""
        name_id = self.intern(frame[0])
        key = (parent, name_id)
        k = self._children.get(key)
        if k is None:
            k = self._children[key] = len(self.parent)
            self.parent.append(parent)
            self.name.append(name_id)
            self.file.append(self.intern(frame[1]))
            self.line.append(frame[2])
            self.module.append(self.intern(frame[3]))
            self.inlined.append(frame[4])
            self.kind.append(kind)
            for col in self.values:
                col.append(0.0)
            if self.base is not None:
                for col in self.base:
                    col.append(0.0)
        elif self.line[k] != frame[2]:
            self.line[k] = 0
        return k

    # -- queries (tests, callers) ------------------------------------------------------

    def label(self, k: int) -> str:
        """The function name of node ``k``."""
        return self.strings[self.name[k]]

    def path(self, k: int) -> tuple[str, ...]:
        """Names from the root's first child down to node ``k``."""
        out = []
        while k > 0:
            out.append(self.label(k))
            k = self.parent[k]
        return tuple(reversed(out))

    def find(self, *names: str) -> int | None:
        """The node at the path ``names`` below the root, or None."""
        k = 0
        for n in names:
            nid = self._ids.get(n)
            if nid is None:
                return None
            nxt = self._children.get((k, nid))
            if nxt is None:
                return None
            k = nxt
        return k

    def children(self, k: int) -> list[int]:
        """The direct children of node ``k`` (linear scan; for tests and small trees)."""
        return [c for c in range(k + 1, len(self.parent)) if self.parent[c] == k]

    def value(self, k: int, index: int) -> float:
        """Node ``k``'s value of sample type ``index`` (new minus base for a diff)."""
        v = self.values[index][k]
        return v - self.base[index][k] if self.base is not None else v

    # -- serialization -------------------------------------------------------------------

    def self_values(self, columns: list[list[float]]) -> list[list[float]]:
        """Per node, what stacks ending exactly there hold (total minus the children's)."""
        out = []
        parent = self.parent
        for col in columns:
            own = list(col)
            for k in range(1, len(parent)):
                own[parent[k]] -= col[k]
            out.append(own)
        return out

    def to_json(self) -> dict[str, Any]:
        """The compact form the HTML viewer reads.

        ``p`` holds ``k - parent[k]`` (small numbers: children usually follow their parent
        closely), ``n``/``f``/``m`` string ids, ``l`` lines, ``i`` the indexes of inlined
        nodes, ``k`` each node's kind (an index into KINDS), ``s`` the four *self* value
        columns rounded to integers (mostly zeros, and totals are their sums over a subtree,
        which the viewer adds up; the inverted tree is built from them), ``sb`` the base's
        self values for a diff.
        """
        out: dict[str, Any] = {
            "inverted": self.inverted,
            "p": [0] + [k - p for k, p in enumerate(self.parent) if k],
            "n": self.name,
            "f": self.file,
            "l": self.line,
            "m": self.module,
            "i": [k for k, flag in enumerate(self.inlined) if flag],
            "k": self.kind,
            "s": [[_int(x) for x in col] for col in self.self_values(self.values)],
        }
        if self.base is not None:
            out["sb"] = [[_int(x) for x in col] for col in self.self_values(self.base)]
        return out


def _int(x: float) -> int:
    # Self values of a subtraction may be -1e-9 instead of 0: never write "-0" or tiny noise.
    r = round(x)
    return r if r > 0 else 0


def location_frames(loc: Location) -> list[FrameKey]:
    """The frames of a location, innermost (inlined) first, as the tree names them."""
    if not loc.frames:
        return [(loc.fallback_name, "", 0, loc.module, False)]
    return [(f.function or loc.fallback_name, f.file, f.line, loc.module, f.inlined)
            for f in loc.frames]


# One frame of an address as both loops walk it: (name id, line, frame, kind id).
_Entry = tuple[int, int, FrameKey, int]


def _entries(tree: CallTree, profile: Profile, kinds: Callable[[int], tuple[str, ...]] | None,
             a: int) -> list[_Entry]:
    """The frames of address ``a``, innermost first, as tree entries."""
    keys = location_frames(profile.location(a))
    ks = kinds(a) if kinds is not None else ("",) * len(keys)
    return [(tree.intern(f[0]), f[2], f, _KIND_ID[c]) for f, c in zip(keys, ks, strict=True)]


def _add(tree: CallTree, profiles: Iterable[Profile], columns: list[list[float]],
         frames: FramePolicy | None) -> None:
    """Add every sample of ``profiles`` into ``columns`` (tree.values or tree.base)."""
    for profile in profiles:
        kinds = frame_kinds(profile, frames) if frames is not None else None
        if core is not None:
            # The same walk in C; frames are looked up as it reaches them.
            core.tree_add(profile.samples, {}, partial(_entries, tree, profile, kinds),
                          tree._children, tree.child, tree.line, columns, tree.inverted)
            continue
        frames_of: dict[int, list[_Entry]] = {}
        children = tree._children
        line = tree.line
        for s in profile.samples:
            vals = s.values
            if not any(vals[:NVALUES]):
                continue
            seq: list[_Entry] = []
            for a in s.stack:
                fr = frames_of.get(a)
                if fr is None:
                    fr = frames_of[a] = _entries(tree, profile, kinds, a)
                seq.extend(fr)
            if not tree.inverted:
                seq.reverse()
            k = 0
            nodes = [0]
            for name_id, line_no, frame, kind in seq:
                nxt = children.get((k, name_id))
                if nxt is None:
                    nxt = tree.child(k, frame, kind)
                elif line[nxt] != line_no:
                    line[nxt] = 0
                k = nxt
                nodes.append(k)
            for i in range(NVALUES):
                v = vals[i]
                if v:
                    col = columns[i]
                    # Each node lies on the path once, so recursion is not counted twice.
                    for node in nodes:
                        col[node] += v


def build_tree(profiles: Iterable[Profile], *, invert: bool = False,
               base: Iterable[Profile] | None = None,
               frames: FramePolicy | None = None) -> CallTree:
    """Merge the samples of ``profiles`` into one call tree.

    With ``frames`` each node also says whose code it is (own, library, dependency, wrapper;
    :func:`heapscope.analysis.fold.frame_kinds`).

    ``base`` makes a diff tree: the base profiles' values are kept in ``CallTree.base`` and
    :meth:`CallTree.value` returns new minus base, node by node (matched by name path).
    """
    tree = CallTree(inverted=invert)
    if base is not None:
        tree.base = [[0.0] for _ in range(NVALUES)]
    _add(tree, profiles, tree.values, frames)
    if base is not None and tree.base is not None:
        _add(tree, base, tree.base, frames)
    return tree
