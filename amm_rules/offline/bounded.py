"""Reading a dump's bytes within bounds: gzip decompressed as it is read, msgpack decoded
with limits on what the decoder may build.

A bound on the decompressed bytes alone (``--max-dump-size``) lets a small file build a
lot: a 190 KB ``.msgpack.gz`` holding one msgpack array of 200 million nils passes a
1 GiB bound with 200 MB, and a decoder that trusts the array's header builds a list of
200 million entries (1.6 GB) before anything is refused. So:

- gzip is decompressed in chunks as the decoder asks for them (:class:`Stream` over
  :func:`inflate`): the decompressed bytes are never held whole, and past ``max_bytes``
  the next chunk is refused;
- msgpack's own limits (:func:`unpacker`): an array or a map of at most
  :func:`items_limit` entries (2,097,152 at the default 1 GiB), a string or binary of
  at most :data:`MAX_STRING` bytes: refused at the header, before anything is built;
- a budget over the whole decoding (:class:`Budget`), relative to the bytes read for
  the parts that are built (those skipped unread do not count): at most one value (an
  entry of an array or a map) per :data:`BYTES_PER_VALUE` bytes, and at most one new
  object (a string, a list, a map...: the interpreter's count of allocated blocks) per
  :data:`BYTES_PER_OBJECT` bytes, beyond :data:`SLACK` of each. A real dump has a value
  per 8 to 14 bytes and an object per 25 or so; an array of nils has a value per byte,
  one of short strings an object per three bytes. Checked as arrays and maps are built,
  every :data:`CHECK_EVERY` values: what is built passes the budget by at most that,
  and one container. So what a dump builds is at most about 9 bytes of memory per byte
  read (strings of six characters), against about 3 for a real dump.

What is refused raises :class:`Refused`, whose text says what and how much (the caller
adds the file's name). Neighbours: :mod:`amm_rules.offline.dump` reads dumps with it.
"""

from __future__ import annotations

import re
import sys
import zlib
from collections.abc import Iterator
from typing import Any

#: Bytes decompressed, and read by the decoder, at a time.
CHUNK = 2**20
#: Longest string or binary value a dump may hold (tracebacks and reprs are far shorter).
MAX_STRING = 2**26
#: Longest extension value (a cluster dump has none).
MAX_EXT = 2**20
#: Values (and objects) decoded for free, whatever the bytes: small dumps are never
#: near the budget.
SLACK = 2**20
#: Bytes read per value, and per object, the budget asks at least (see the module
#: docstring): a real dump has a value per 8 to 14 bytes and an object per 25 or so.
BYTES_PER_VALUE = 2
BYTES_PER_OBJECT = 8
#: Values built between two checks of the budget (an object count costs microseconds).
CHECK_EVERY = 2**16
_GZIP = b"\x1f\x8b"
_LIMIT = re.compile(r"(\d+) exceeds max_(array|map|str|bin|ext)_len\((\d+)\)")
_WHAT = {
    "array": "an array",
    "map": "a map",
    "str": "a string",
    "bin": "a binary",
    "ext": "an ext",
}


class Refused(Exception):
    """What the bounds refuse; ``str()`` is one sentence, without the file's name."""


def items_limit(max_bytes: int) -> int:
    """Most entries of one array or map, for a dump of at most ``max_bytes`` bytes (a
    real dump's largest, its tasks, has an entry per 700 bytes or so)."""
    return max(2**20, max_bytes // 512)


def inflate(raw: bytes, max_bytes: int, too_large: str) -> Iterator[bytes]:
    """The decompressed chunks of gzip data (of one member or several), as they are
    asked for; :class:`Refused` with ``too_large`` as soon as they pass ``max_bytes``."""
    total = 0
    data = raw
    while data:
        engine = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while True:
                chunk = engine.decompress(data, CHUNK) if data else engine.flush()
                data = engine.unconsumed_tail
                total += len(chunk)
                if total > max_bytes:
                    raise Refused(too_large)
                if chunk:
                    yield chunk
                elif not data:
                    break  # the input consumed and flushed
        except zlib.error as exc:
            raise Refused(f"not readable as gzip ({exc})") from None
        if not engine.eof:
            raise Refused("the gzip data ends early (the file is truncated)")
        data = engine.unused_data
        if data and data[:2] != _GZIP:
            return  # trailing garbage after the last member, as gzip tolerates


class Stream:
    """Bytes read as from a file (what msgpack's ``Unpacker`` reads), from a whole
    ``bytes`` or from gzip data decompressed as it is read."""

    def __init__(self, raw: bytes, max_bytes: int, too_large: str):
        self._chunks: Iterator[bytes] = (
            inflate(raw, max_bytes, too_large) if raw[:2] == _GZIP else iter((raw,))
        )
        self._head = memoryview(b"")
        #: Bytes handed out so far (the decompressed size of what was read).
        self.read_so_far = 0

    def _fill(self) -> bool:
        while not self._head:
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            self._head = memoryview(chunk)
        return True

    def peek(self) -> int:
        """The next byte, or -1 at the end."""
        return self._head[0] if self._fill() else -1

    def read(self, n: int = -1) -> bytes:
        """At most ``n`` bytes (``b""`` only at the end); all that is left without ``n``."""
        if n < 0:
            out = b"".join([bytes(self._head), *self._chunks])
            self._head = memoryview(b"")
        elif not self._fill():
            return b""
        else:
            out = bytes(self._head[:n])
            self._head = self._head[n:]
        self.read_so_far += len(out)
        return out


class Budget:
    """What a decoding may build (see the module docstring): its hooks are msgpack's
    ``list_hook`` and ``object_hook``, and :meth:`skip` skips a value unread."""

    def __init__(self, stream: Stream):
        self.stream = stream
        #: Values built: an array's entries and itself, a map's keys, values and itself.
        self.values = 0
        #: Bytes skipped unread (they buy nothing).
        self.skipped = 0
        self._blocks = sys.getallocatedblocks()
        self._next = SLACK

    def array(self, items: list[Any]) -> list[Any]:
        self._count(len(items) + 1)
        return items

    def map(self, entries: dict[Any, Any]) -> dict[Any, Any]:
        self._count(2 * len(entries) + 1)
        return entries

    def _count(self, values: int) -> None:
        self.values += values
        if self.values < self._next:
            return
        self._next = self.values + CHECK_EVERY
        read = self.stream.read_so_far - self.skipped
        if self.values > read // BYTES_PER_VALUE + SLACK:
            raise Refused(
                f"decodes to {self.values:,} values from {read:,} bytes, more than a cluster "
                f"dump holds (at most one per {BYTES_PER_VALUE} bytes); a decoding bomb?"
            )
        objects = sys.getallocatedblocks() - self._blocks
        if objects > read // BYTES_PER_OBJECT + SLACK:
            raise Refused(
                f"decodes to {objects:,} objects from {read:,} bytes, more than a cluster "
                f"dump holds (at most one per {BYTES_PER_OBJECT} bytes); a decoding bomb?"
            )

    def skip(self, unpacker: Any) -> None:
        start = unpacker.tell()
        unpacker.skip()
        self.skipped += unpacker.tell() - start


def unpacker(stream: Stream, budget: Budget, max_bytes: int) -> Any:
    """msgpack's ``Unpacker`` reading ``stream``, with its limits and ``budget``'s hooks."""
    import msgpack

    items = items_limit(max_bytes)
    return msgpack.Unpacker(
        stream,
        read_size=CHUNK,
        strict_map_key=False,
        raw=False,
        max_buffer_size=MAX_STRING + 2 * CHUNK,
        max_str_len=MAX_STRING,
        max_bin_len=MAX_STRING,
        max_ext_len=MAX_EXT,
        max_array_len=items,
        max_map_len=items,
        list_hook=budget.array,
        object_hook=budget.map,
    )


def limit_words(exc: Exception) -> str | None:
    """msgpack's words for a value over a limit, as a sentence; None for other errors."""
    m = _LIMIT.search(str(exc))
    if m is None:
        return None
    size, kind, most = int(m[1]), m[2], int(m[3])
    unit = "bytes" if kind in ("str", "bin", "ext") else "entries"
    return (
        f"{_WHAT[kind]} of {size:,} {unit}, more than a cluster dump holds (at most "
        f"{most:,}; --max-dump-size raises the limit of entries); a decoding bomb?"
    )
