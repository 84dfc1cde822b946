"""A fuzz campaign against every reader and writer: mutations of real inputs, counted, crashes
kept.

    python -m tests.fuzz.campaign --inputs 1000000 --jobs 2 --out fuzz-findings/

Readers (targets.py) read the input; writers (writers.py) read a fuzzed dump as the commands
do and write it with each of heapscope's writers (export formats, reports, flame graph, call
graph, a diff of two dumps, round trips through the files heapscope reads back), checking
that the output is well formed. Each input is a seed of the target (real dumps of every
dialect, the symbolized JSON and profile.proto written from them, a perf map, suppressions,
a session manifest) changed by a few random mutations: bit flips, byte and chunk
insertions, deletions and duplications, splices of two seeds, line
deletions/duplications/swaps, numbers replaced by edge values
(0, -1, 2^63, 2^64, 19 and 5,000 digits, nan, inf), JSON values replaced by other types or
deep nesting, truncation; one input in eight is random bytes. This is a mutational fuzzer
seeded from real files, not a coverage-guided one.

A crash is an exception the target does not allow (see targets.py and writers.py, where
malformed output raises too); a hang is an input
that runs past ``--timeout`` seconds (SIGALRM). Each distinct crash (target, exception type,
innermost heapscope frame) is saved once under ``--out`` with its input. The summary prints
inputs per target, how many of them the target took without an error ("passed": for a
writer, read and written), crashes and hangs. Deterministic for a given ``--seed``.
Shrunk crash inputs are kept as regression cases in findings/ (see its README).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tests.fuzz.targets import READERS, Target
from tests.fuzz.writers import WRITERS

TARGETS = READERS + WRITERS  # every target, readers first

EDGE_NUMBERS = [b"0", b"-1", b"1", b"9223372036854775807", b"9223372036854775808",
                b"18446744073709551616", b"9" * 19, b"9" * 20, b"9" * 5000, b"nan", b"inf",
                b"-0", b"1e308", b"0x", b"00000000000000000000001"]
_NUMBER = re.compile(rb"\d+")


class Hang(Exception):
    """The input ran past the time limit."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _json_mutation(rng: random.Random, data: bytes) -> bytes:
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    nodes: list[tuple[Any, Any]] = []

    def walk(x: Any, depth: int = 0) -> None:
        if depth > 6 or len(nodes) > 2000:
            return
        if isinstance(x, dict):
            for k in list(x):
                nodes.append((x, k))
                walk(x[k], depth + 1)
        elif isinstance(x, list):
            for i in range(len(x)):
                nodes.append((x, i))
                walk(x[i], depth + 1)

    walk(doc)
    if not nodes:
        return data
    for _ in range(rng.randint(1, 3)):
        parent, key = rng.choice(nodes)
        parent[key] = rng.choice([None, True, -1, 0, 2**64, 1e308, "x", "", [], {}, [[[]]],
                                  [1, 2], {"a": 1}, "NaN", float("nan"), 5e-324])
    try:
        return json.dumps(doc).encode()
    except (ValueError, TypeError):
        return data


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    """One fuzz input from the seeds."""
    if rng.random() < 0.125:
        return rng.randbytes(rng.randint(0, 600))
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(11)
        n = len(data)
        if op == 0 and n:  # flip bits
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert random bytes
            at = rng.randint(0, n)
            data[at:at] = rng.randbytes(rng.randint(1, 32))
        elif op == 2 and n:  # delete a chunk
            at = rng.randrange(n)
            del data[at:at + rng.randint(1, 256)]
        elif op == 3 and n:  # duplicate a chunk
            at = rng.randrange(n)
            data[at:at] = data[at:at + rng.randint(1, 512)]
        elif op == 4:  # splice with another seed
            other = rng.choice(seeds)
            data = data[:rng.randint(0, n)] + other[rng.randint(0, len(other)):]
        elif op in (5, 6):  # lines: delete, duplicate or swap
            lines = bytes(data).split(b"\n")
            if len(lines) > 1:
                i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
                if op == 5:
                    lines[i], lines[j] = lines[j], lines[i]
                elif rng.random() < 0.5:
                    del lines[i]
                else:
                    lines.insert(i, lines[j])
                data = bytearray(b"\n".join(lines))
        elif op in (7, 8):  # a number becomes an edge value
            found = list(_NUMBER.finditer(data))
            if found:
                m = rng.choice(found)
                data[m.start():m.end()] = rng.choice(EDGE_NUMBERS)
        elif op == 9:  # JSON-aware: a value of another type
            data = bytearray(_json_mutation(rng, bytes(data)))
        elif n:  # truncate
            del data[rng.randrange(n):]
    return bytes(data)


@dataclass
class Result:
    """What one worker found."""

    inputs: dict[str, int] = field(default_factory=dict)
    # inputs the target went through without an error (for a writer: read and written)
    passed: dict[str, int] = field(default_factory=dict)
    crashes: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # key -> (tb, input)
    hangs: dict[str, bytes] = field(default_factory=dict)


def _crash_key(target: str, exc: BaseException) -> tuple[str, str]:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "heapscope" in f.filename] or frames
    where = f"{os.path.basename(ours[-1].filename)}:{ours[-1].lineno}" if ours else "?"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]
    return f"{target}|{type(exc).__name__}|{where}", text


def run_worker(args: tuple[int, int, float] | tuple[int, int, float, tuple[str, ...]]
               ) -> Result:
    """Fuzz the targets (all, or those named) round-robin for ``count`` inputs from random
    seed ``seed``."""
    seed, count, timeout = args[:3]
    names = args[3] if len(args) > 3 else ()
    targets = [t for t in TARGETS if not names or t.name in names]
    rng = random.Random(seed)
    seeds = {t.name: t.seeds() for t in targets}
    signal.signal(signal.SIGALRM, _alarm)
    out = Result()
    with tempfile.TemporaryDirectory(prefix="heapscope-fuzz-", dir=_scratch_root()) as tmp:
        scratch = os.path.join(tmp, "input")
        for k in range(count):
            t: Target = targets[k % len(targets)]
            data = mutate(rng, seeds[t.name])
            out.inputs[t.name] = out.inputs.get(t.name, 0) + 1
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                t.run(data, scratch)
                out.passed[t.name] = out.passed.get(t.name, 0) + 1
            except Hang:
                out.hangs.setdefault(t.name, data)
            except t.allowed:
                pass
            except Exception as e:  # every other exception is a finding
                key, text = _crash_key(t.name, e)
                out.crashes.setdefault(key, (text, data))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    return out


def _scratch_root() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def campaign(inputs: int, jobs: int, seed: int, timeout: float,
             targets: tuple[str, ...] = ()) -> Iterator[Result]:
    """Run ``inputs`` inputs split over ``jobs`` processes, in chunks; yield each chunk's."""
    chunk = 20_000
    work = [(seed * 1_000_003 + i, min(chunk, inputs - i * chunk), timeout, targets)
            for i in range(-(-inputs // chunk))]
    if jobs <= 1:
        yield from map(run_worker, work)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(run_worker, work)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds before a hang")
    ap.add_argument("--out", default="fuzz-findings", help="folder for crashing inputs")
    ap.add_argument("--target", action="append", default=[],
                    help="fuzz only this target (repeatable): " + ", ".join(
                        t.name for t in TARGETS))
    args = ap.parse_args(argv)
    total = Result()
    start = time.time()
    done = 0
    for r in campaign(args.inputs, args.jobs, args.seed, args.timeout, tuple(args.target)):
        for k, v in r.inputs.items():
            total.inputs[k] = total.inputs.get(k, 0) + v
        for k, v in r.passed.items():
            total.passed[k] = total.passed.get(k, 0) + v
        for k, v in r.crashes.items():
            total.crashes.setdefault(k, v)
        for k, h in r.hangs.items():
            total.hangs.setdefault(k, h)
        done += sum(r.inputs.values())
        print(f"{done:,} inputs, {len(total.crashes)} crashes, {len(total.hangs)} hangs, "
              f"{time.time() - start:.0f} s", file=sys.stderr, flush=True)
    if total.crashes or total.hangs:
        os.makedirs(args.out, exist_ok=True)
        for i, (key, (text, data)) in enumerate(sorted(total.crashes.items())):
            with open(os.path.join(args.out, f"crash-{i}.bin"), "wb") as f:
                f.write(data)
            with open(os.path.join(args.out, f"crash-{i}.txt"), "w") as f:
                f.write(key + "\n" + text)
        for name, data in total.hangs.items():
            with open(os.path.join(args.out, f"hang-{name}.bin"), "wb") as f:
                f.write(data)
    print(json.dumps({"inputs": total.inputs, "passed": total.passed,
                      "total": sum(total.inputs.values()),
                      "seconds": round(time.time() - start),
                      "crashes": sorted(total.crashes), "hangs": sorted(total.hangs)}, indent=2))
    return 1 if total.crashes or total.hangs else 0


if __name__ == "__main__":
    sys.exit(main())
