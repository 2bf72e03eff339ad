"""Our own header-only GGUF reader: metadata and tensor infos, never tensor data.

Only the header is read (buffered, on demand), never the tensor data. Reading is
bounded: every count and length is checked against the bytes left in the file
before anything is allocated, arrays nest at most `MAX_ARRAY_DEPTH` deep, and
tensor extents are checked against the file size. What a header may make the
reader build is capped (metadata keys, tensors, array elements that become Python
objects); a long numeric array is never turned into Python numbers: its value is
a read-only memoryview of the header's bytes, cast to the element type (numpy,
should a caller want it, wraps one without a copy: `np.asarray(view)`); the
standard library suffices, so reading a header imports no numpy. Anything wrong raises
`ArtifactError`, whose `.finding` is a `PWR10x` finding naming the file and the
byte offset; nothing else escapes (no struct.error, no MemoryError, no hang:
directories, FIFOs and devices are refused before they are opened for reading).

Layout (GGUF v3, little-endian): magic "GGUF", u32 version, u64 tensor count,
u64 metadata count; each metadata entry: string key, u32 value type, value
(strings are u64 length + UTF-8 bytes; arrays are u32 element type + u64 count +
elements); each tensor info: string name, u32 n_dims, u64 x n_dims (ne0 first),
u32 ggml type, u64 offset relative to the data section, which starts at the
header's end rounded up to `general.alignment` (32 by default).
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from power.artifacts.bounded_reader import DocumentError, Reason, open_regular
from power.artifacts.ggml_types import QUANT_TYPES, ValueType
from power.findings import PowerError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_ARRAY_DEPTH = 2
MAX_DIMS = 4
# The smallest encodings, used to bound counts before allocating: a metadata entry is at
# least an empty key (8) + a type (4) + a 1-byte value; a tensor info an empty name (8) +
# n_dims (4) + one dim (8) + type (4) + offset (8).
MIN_KV_BYTES = 13
MIN_TENSOR_INFO_BYTES = 32
INT64_MAX = 2**63 - 1
# Real headers are a few MB (a 248k-token vocabulary is about 8 MB); reading stops at this cap.
MAX_HEADER_BYTES = 256 << 20
INITIAL_READ = 1 << 20
GROW_PIECE = 16 << 20
# What one header may make the reader hold as Python objects. Real models have tens of metadata keys, at most
# a few thousand tensors and vocabularies of a few hundred thousand tokens (Gemma 3: 262,144); each cap is far
# above that, and a header past one is refused (PWR105) before anything is built for it.
MAX_METADATA_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
# Array elements that become Python objects (strings, inner arrays, short numeric arrays' numbers), all arrays together.
MAX_ARRAY_OBJECTS = 1 << 21
# Numeric arrays up to this length (per-layer values) are lists; longer ones (token types, scores) stay
# read-only memoryviews of the header bytes (bool arrays as uint8): no element becomes a Python object.
MAX_LIST_ELEMENTS = 4096

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_SCALARS: dict[ValueType, struct.Struct] = {
    ValueType.UINT8: struct.Struct("<B"),
    ValueType.INT8: struct.Struct("<b"),
    ValueType.UINT16: struct.Struct("<H"),
    ValueType.INT16: struct.Struct("<h"),
    ValueType.UINT32: struct.Struct("<I"),
    ValueType.INT32: struct.Struct("<i"),
    ValueType.FLOAT32: struct.Struct("<f"),
    ValueType.BOOL: struct.Struct("<?"),
    ValueType.UINT64: struct.Struct("<Q"),
    ValueType.INT64: struct.Struct("<q"),
    ValueType.FLOAT64: struct.Struct("<d"),
}
# A long numeric array's memoryview format (native order, the file's is little-endian) and its element type's name.
_VIEW_FORMATS: dict[ValueType, str] = {
    ValueType.UINT8: "B", ValueType.INT8: "b", ValueType.UINT16: "H", ValueType.INT16: "h",
    ValueType.UINT32: "I", ValueType.INT32: "i", ValueType.FLOAT32: "f", ValueType.BOOL: "B",
    ValueType.UINT64: "Q", ValueType.INT64: "q", ValueType.FLOAT64: "d",
}
_VIEW_ELEMENT_TYPES = {"B": "uint8", "b": "int8", "H": "uint16", "h": "int16", "I": "uint32", "i": "int32",
                       "Q": "uint64", "q": "int64", "f": "float32", "d": "float64"}


class ArtifactError(PowerError):
    """An artifact Power cannot use (unreadable, not a GGUF, changed, or not what the runtime can load);
    `.finding` names the file, the code and, for a bad header, the byte offset."""

    code = "PWR100"


def artifact_error(code: str, path: str | os.PathLike[str], message: str, hint: str,
                   offset: int | None = None) -> ArtifactError:
    return ArtifactError(message, code=code, file=str(path), offset=offset, hint=hint)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: ne0 (contiguous) first
    ggml_type: int
    offset: int  # relative to the data section
    nbytes: int

    @property
    def type_name(self) -> str:
        return QUANT_TYPES[self.ggml_type].name

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major (numpy/torch) shape: the dims reversed."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class ArraySpan:
    """Where an array value's elements lie in the file, for hashing them without decoding."""

    element_type: str
    count: int
    start: int
    end: int


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    size: int
    version: int
    alignment: int
    data_offset: int
    metadata: dict[str, Any]
    value_types: dict[str, str]  # key -> "uint32", "string", "array[int32]", ...
    tensors: tuple[TensorInfo, ...]
    array_spans: dict[str, ArraySpan] = field(default_factory=dict)
    # The header's bytes as read (array spans index into them, long numeric arrays are views of them):
    # tokenizer fingerprints hash them directly. Never modified.
    raw: bytes | bytearray = field(default=b"", repr=False, compare=False)
    # key -> the byte offset of its metadata entry, so a finding about a value can point at it.
    key_offsets: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, as `power.runtime.gguf_weights.GGUFFile.get` gives it (the tokenizer reads either)."""
        return self.metadata.get(key, default)


def view_element_type(view: memoryview) -> str:
    """The element type of a long numeric array's view: "int32", "float32", ... (a bool array's is "uint8")."""
    return _VIEW_ELEMENT_TYPES[view.format]


def _numeric_view(header: memoryview, fmt: str, start: int, end: int) -> memoryview:
    """The little-endian elements in `header[start:end]`, read-only: a view of those bytes (on a big-endian host,
    a byte-swapped copy, still one machine number per element)."""
    if sys.byteorder == "little":
        return header[start:end].cast(fmt)  # type: ignore[call-overload]  # typeshed's overloads take literal formats
    swapped = array(fmt)
    swapped.frombytes(header[start:end])
    swapped.byteswap()
    return memoryview(swapped).toreadonly()


def _type_label(vtype: ValueType, sub: str | None = None) -> str:
    return f"array[{sub}]" if vtype == ValueType.ARRAY else vtype.name.lower()


class _Cursor:
    """A bounded position in the header, over a prefix of the file read on demand (doubling, never past the cap).

    Buffered reads rather than a memory map: a file truncated underneath us then gives a
    short read (a finding), where a mapped page past the new end would kill the process.
    One bytearray grown in place, in pieces of at most GROW_PIECE bytes, so a large header
    costs its own size in memory, not its size plus every smaller copy of it.
    """

    def __init__(self, read: Callable[[int, int], bytes], size: int, path: str) -> None:
        self.read, self.size, self.path, self.pos = read, size, path, 0
        self.buf = bytearray()

    def fail(self, code: str, message: str, hint: str, offset: int | None = None) -> ArtifactError:
        return artifact_error(code, self.path, message, hint, self.pos if offset is None else offset)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail("PWR104", f"the header ends inside {what}: {n} bytes needed, {self.size - self.pos} left",
                            "the file is truncated or not completely downloaded: fetch it again")
        if self.pos + n > len(self.buf):
            self._grow(self.pos + n)

    def _grow(self, end: int) -> None:
        if end > MAX_HEADER_BYTES:
            raise self.fail("PWR105", f"the header runs past {MAX_HEADER_BYTES >> 20} MiB (no real GGUF header is that "
                            "large)", "the header is corrupt or hostile: re-download or re-convert the artifact")
        target = min(self.size, MAX_HEADER_BYTES, max(end, 2 * len(self.buf), INITIAL_READ))
        while len(self.buf) < target:
            piece = self.read(min(GROW_PIECE, target - len(self.buf)), len(self.buf))
            if not piece:
                break
            self.buf += piece
        if len(self.buf) < end:
            raise artifact_error("PWR116", self.path, "the file became shorter while its header was read",
                                 "wait until the download or copy finishes, then inspect again", len(self.buf))

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def check_length(self, length: int, what: str, at: int) -> None:
        """A length that the rest of the file cannot hold: absurd if it exceeds the whole file, else truncation."""
        if length > self.size - self.pos:
            if length > self.size:
                raise self.fail("PWR105", f"{what} claims {length} bytes but the whole file has {self.size}",
                                "the header is corrupt: re-download or re-convert the artifact", at)
        self.need(length, what)

    def raw_string(self, what: str) -> bytearray:
        at = self.pos
        length = self.u64(f"the length of {what}")
        self.check_length(length, what, at)
        value = self.buf[self.pos:self.pos + length]
        self.pos += length
        return value

    def string(self, what: str) -> str:
        at = self.pos
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail("PWR117", f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start} of the string)",
                            "the header is corrupt: re-download or re-convert the artifact", at) from None

    def value_type(self, what: str) -> ValueType:
        at = self.pos
        raw = self.u32(what)
        try:
            return ValueType(raw)
        except ValueError:
            raise self.fail("PWR106", f"{what} has unknown value type {raw}", "the header is corrupt or from a newer "
                            "GGUF revision: re-convert the artifact with a current gguf writer", at) from None


class _HeaderParser:
    def __init__(self, cursor: _Cursor) -> None:
        self.cur = cursor
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, str] = {}
        self.spans: dict[str, ArraySpan] = {}
        self.objects = 0
        # Long numeric arrays, viewed once the header's bytes are final: (container, key or index, format, start, end).
        self.views: list[tuple[Any, Any, str, int, int]] = []
        self.offsets: dict[str, int] = {}

    def parse(self) -> GGUFHeader:
        cur = self.cur
        cur.need(4, "the magic")
        magic = bytes(cur.buf[0:4])
        if magic != GGUF_MAGIC:
            raise cur.fail("PWR102", f"not a GGUF file: magic is {magic!r}, expected b'GGUF'",
                           "point the manifest at a .gguf artifact", 0)
        cur.pos = 4
        version = cur.u32("the version")
        if version != SUPPORTED_VERSION:
            raise cur.fail("PWR103", f"GGUF version {version} is not supported (only version {SUPPORTED_VERSION})",
                           "re-convert the model with a current llama.cpp convert script", 4)
        n_tensors = self._count("the tensor count", MIN_TENSOR_INFO_BYTES, MAX_TENSORS)
        n_kv = self._count("the metadata count", MIN_KV_BYTES, MAX_METADATA_KEYS)
        for _ in range(n_kv):
            self._key_value()
        alignment = self._alignment()
        tensors = tuple(self._tensor_infos(n_tensors))
        data_offset = -(-cur.pos // alignment) * alignment
        self._check_extents(tensors, data_offset, alignment)
        header_bytes = memoryview(cur.buf).toreadonly()
        for container, slot, fmt, start, end in self.views:
            container[slot] = _numeric_view(header_bytes, fmt, start, end)
        return GGUFHeader(path=cur.path, size=cur.size, version=version, alignment=alignment, data_offset=data_offset,
                          metadata=self.metadata, value_types=self.value_types, tensors=tensors, array_spans=self.spans,
                          raw=cur.buf, key_offsets=self.offsets)

    def _count(self, what: str, min_bytes: int, limit: int) -> int:
        at = self.cur.pos
        count = self.cur.u64(what)
        if count > limit:
            raise self.cur.fail("PWR105", f"{what} is {count}; no real model has more than {limit:,}",
                                "the header is corrupt or hostile: re-download or re-convert the artifact", at)
        if count * min_bytes > self.cur.size - self.cur.pos:
            absurd = count * min_bytes > self.cur.size
            raise self.cur.fail("PWR105" if absurd else "PWR104", f"{what} is {count}, more than the "
                                f"{self.cur.size - self.cur.pos} bytes left can hold",
                                "the header is corrupt or truncated: re-download the artifact", at)
        return count

    def _key_value(self) -> None:
        at = self.cur.pos
        key = self.cur.string("a metadata key")
        if key in self.metadata:
            raise self.cur.fail("PWR107", f"metadata key {key!r} appears twice", "the header is corrupt: re-convert "
                                "the artifact", at)
        vtype = self.cur.value_type(f"the type of {key!r}")
        if vtype == ValueType.ARRAY:
            self.metadata[key], label = self._array(key, depth=1, container=self.metadata, slot=key)
        else:
            self.metadata[key], label = self._scalar(vtype, key), _type_label(vtype)
        self.value_types[key] = label
        self.offsets[key] = at

    def _scalar(self, vtype: ValueType, key: str) -> Any:
        if vtype == ValueType.STRING:
            return self.cur.string(f"the value of {key!r}")
        packer = _SCALARS[vtype]
        self.cur.need(packer.size, f"the value of {key!r}")
        (value,) = packer.unpack_from(self.cur.buf, self.cur.pos)
        self.cur.pos += packer.size
        return value

    def _array(self, key: str, depth: int, container: Any, slot: Any) -> tuple[Any, str]:
        """The array's value: a list, or (long numeric arrays) None until `parse` puts a view in `container[slot]`."""
        cur = self.cur
        at = cur.pos
        element = cur.value_type(f"the element type of {key!r}")
        count = cur.u64(f"the element count of {key!r}")
        if element == ValueType.ARRAY and depth >= MAX_ARRAY_DEPTH:
            raise cur.fail("PWR106", f"{key!r} nests arrays deeper than {MAX_ARRAY_DEPTH}",
                           "the header is corrupt or hostile: re-convert the artifact", at)
        min_size = _SCALARS[element].size if element in _SCALARS else (8 if element == ValueType.STRING else 12)
        if count * min_size > cur.size - cur.pos:
            cur.check_length(count * min_size, f"the {count} elements of {key!r}", at)
        elif element in _SCALARS:
            cur.need(count * min_size, f"the {count} elements of {key!r}")
        start = cur.pos
        values: Any
        viewed = element in _SCALARS and count > MAX_LIST_ELEMENTS
        if not viewed:
            self._spend(count, key, at)
        if element == ValueType.STRING:
            values = self._string_elements(key, count)
        elif element == ValueType.ARRAY:
            values = [None] * count
            for index in range(count):
                values[index] = self._array(key, depth + 1, values, index)[0]
        elif viewed:
            values = None
            end = cur.pos + count * _SCALARS[element].size
            self.views.append((container, slot, _VIEW_FORMATS[element], cur.pos, end))
            cur.pos = end
        else:
            values = list(struct.unpack_from(f"<{count}{_SCALARS[element].format[-1]}", cur.buf, cur.pos))
            cur.pos += count * _SCALARS[element].size
        label = _type_label(element) if element != ValueType.ARRAY else "array"
        if depth == 1:
            self.spans[key] = ArraySpan(label, count, start, cur.pos)
        return values, f"array[{label}]"

    def _spend(self, count: int, key: str, at: int) -> None:
        """Count array elements that become Python objects against MAX_ARRAY_OBJECTS."""
        self.objects += count
        if self.objects > MAX_ARRAY_OBJECTS:
            raise self.cur.fail("PWR105", f"{key!r} brings the header's array elements to {self.objects:,}; no "
                                f"real model has more than {MAX_ARRAY_OBJECTS:,} (a vocabulary of a few hundred "
                                "thousand tokens)", "the header is corrupt or hostile: re-download or re-convert "
                                "the artifact", at)

    def _string_elements(self, key: str, count: int) -> list[str]:
        """One pass over length-prefixed strings: slice, then decode (invalid UTF-8 kept via surrogateescape).

        The slices are decoded as one NUL-joined string, split again: a NUL ends an unfinished UTF-8 sequence just
        as the end of a slice does, so each part is its slice decoded alone; a slice holding a NUL (more parts than
        slices) is decoded one by one instead.
        """
        cur, unpack = self.cur, _U64.unpack_from
        buf, pos = cur.buf, cur.pos
        buf_len = len(buf)
        raw: list[bytearray] = [bytearray()] * count
        for i in range(count):
            start = pos + 8
            if start > buf_len:
                cur.pos = pos
                cur.need(8, f"the length of element {i} of {key!r}")
                buf, buf_len = cur.buf, len(cur.buf)
            stop = start + unpack(buf, pos)[0]
            if stop > buf_len:
                cur.pos = start
                cur.check_length(stop - start, f"element {i} of {key!r}", pos)
                buf, buf_len = cur.buf, len(cur.buf)
            raw[i] = buf[start:stop]
            pos = stop
        cur.pos = pos
        parts = b"\0".join(raw).decode("utf-8", "surrogateescape").split("\0")
        return parts if len(parts) == count else [item.decode("utf-8", "surrogateescape") for item in raw]

    def _alignment(self) -> int:
        value = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
            raise self.cur.fail("PWR117", f"general.alignment is {value!r}, expected a power of two",
                                "the header is corrupt: re-convert the artifact")
        return value

    def _tensor_infos(self, count: int) -> list[TensorInfo]:
        cur, names, infos = self.cur, set(), []
        for index in range(count):
            at = cur.pos
            name = cur.string(f"the name of tensor {index}")
            if name in names:
                raise cur.fail("PWR107", f"tensor {name!r} appears twice", "the header is corrupt: "
                                                                           "re-convert the artifact", at)
            names.add(name)
            n_dims = cur.u32(f"the dimension count of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cur.fail("PWR108", f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)",
                               "the header is corrupt: re-convert the artifact", cur.pos - 4)
            dims = tuple(cur.u64(f"dimension {d} of {name!r}") for d in range(n_dims))
            type_at = cur.pos
            ggml_type = cur.u32(f"the type of {name!r}")
            offset = cur.u64(f"the data offset of {name!r}")
            infos.append(TensorInfo(name, dims, ggml_type, offset, self._nbytes(name, dims, ggml_type, type_at)))
        return infos

    def _nbytes(self, name: str, dims: tuple[int, ...], ggml_type: int, at: int) -> int:
        if ggml_type not in QUANT_TYPES:
            raise self.cur.fail("PWR108", f"tensor {name!r} has unknown ggml type {ggml_type}",
                                "the artifact uses a quant type Power does not know (artifacts/ggml_types.py): "
                                "re-quantise it to a known type", at)
        quant = QUANT_TYPES[ggml_type]
        elements = 1
        for dim in dims:
            elements *= dim
        if any(dim == 0 for dim in dims) or elements > INT64_MAX:
            raise self.cur.fail("PWR108", f"tensor {name!r} has dimensions {list(dims)}: empty or over 2^63 elements",
                                "the header is corrupt: re-convert the artifact", at)
        if dims[0] % quant.block_size:
            raise self.cur.fail("PWR108", f"tensor {name!r} rows of {dims[0]} are not whole {quant.name} blocks of "
                                f"{quant.block_size}", "the header is corrupt: re-quantise the artifact", at)
        return elements // quant.block_size * quant.type_size

    def _check_extents(self, tensors: tuple[TensorInfo, ...], data_offset: int, alignment: int) -> None:
        data_size = self.cur.size - data_offset
        previous_end, previous_name = 0, None
        for info in sorted(tensors, key=lambda t: t.offset):
            absolute = data_offset + info.offset
            if info.offset % alignment:
                raise artifact_error("PWR109", self.cur.path, f"tensor {info.name!r} data offset "
                                     f"{info.offset} is not a multiple of the alignment {alignment}",
                                     "the header is corrupt: re-convert the "
                                     "artifact", absolute)
            if info.offset < previous_end:
                raise artifact_error("PWR109", self.cur.path, f"tensor {info.name!r} overlaps tensor {previous_name!r}",
                                     "the header is corrupt: re-convert the artifact", absolute)
            if info.offset + info.nbytes > data_size:
                raise artifact_error("PWR109", self.cur.path, f"tensor {info.name!r} needs bytes up to "
                                     f"{absolute + info.nbytes} but the file ends at {self.cur.size}",
                                     "the tensor data is truncated: re-download the artifact", absolute)
            previous_end, previous_name = info.offset + info.nbytes, info.name


def open_regular_file(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open `path` for reading only if it is a regular file (a FIFO would block, a directory cannot be read)."""
    try:
        return open_regular(path)
    except DocumentError as err:
        if err.reason is Reason.NOT_REGULAR:
            raise artifact_error(
                "PWR101", path, f"the artifact {err.message}", "point the manifest at the .gguf file itself"
            ) from None
        raise artifact_error(
            "PWR100",
            path,
            f"cannot open the artifact: {err.message.removeprefix('cannot read: ')}",
            "check the path (relative paths are relative to the manifest) and its permissions",
        ) from None


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read a GGUF header (metadata + tensor infos); raises ArtifactError with a PWR10x finding on a bad file."""
    fd, before = open_regular_file(path)
    name = str(Path(path))
    try:
        header = read_open_header(fd, before.st_size, name)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise artifact_error("PWR116", name, "the file changed while its header was read",
                             "wait until the download or copy finishes, then inspect again")
    return header


def read_open_header(fd: int, size: int, path: str) -> GGUFHeader:
    """The header of the GGUF open as `fd` (`size` bytes), read with positioned reads: the file offset is not moved.
    `header.raw` holds the bytes it was parsed from, so a loader can hash them against the file's verified bytes."""
    return _HeaderParser(_Cursor(lambda n, at: os.pread(fd, n, at), size, path)).parse()
