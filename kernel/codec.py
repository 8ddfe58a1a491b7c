"""The wire format of the data plane: msgpack with a numpy extension type, validated on decode.

Whoever can write to Redis or to a function's input must not be able to run code on the
learner, so there is no pickle here: a payload is plain msgpack, arrays travel as (dtype,
shape, raw bytes) and are rebuilt with ``numpy.frombuffer`` (zero-copy, read-only) only after
the dtype is on a whitelist and the shape matches the byte count.

A small payload must not cost much to decode either: 8 MiB of empty msgpack lists would
become ~8 million Python lists (~0.5 GiB, seconds of CPU). So before msgpack builds
anything, a scan of the headers counts objects and nesting against the kind's limits and
refuses any extension type but arrays; each kind has its own byte cap; and after decoding,
a walk refuses every type outside the schema's (maps with string keys, lists, strings,
bytes, numbers, booleans, nil, arrays). Large payloads are decoded off the event loop
(``decode_async``).
"""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

#: Bumped whenever the envelope or the array encoding changes incompatibly.
SCHEMA_VERSION = 1
_EXT_NDARRAY = 1
#: Default cap on one payload of a kind without its own: Lambda's synchronous payload limit
#: is 6 MB, but batches through Redis may be larger (Atari fragments).
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one payload of a kind may hold. Arrays travel as one extension object each,
    so honest payloads hold few objects however many bytes they carry."""

    #: Byte cap of the whole payload.
    max_bytes: int
    #: msgpack objects (maps, lists, scalars, arrays) in the whole payload.
    max_objects: int
    #: Longest string (error texts, request ids; a checkpoint's RNG state).
    max_str_len: int = 1 << 20
    #: Deepest nesting of maps and lists.
    max_depth: int = 32


LIMITS: dict[str | None, Limits] = {
    # A 16M-parameter float32 model; the Nature CNN is ~7 MB.
    "weights": Limits(max_bytes=64 * 1024 * 1024, max_objects=10_000),
    "batch": Limits(max_bytes=DEFAULT_MAX_BYTES, max_objects=10_000),
    # Written by the learner host itself: history and request ids of long runs.
    "checkpoint": Limits(max_bytes=1 << 34, max_objects=50_000_000, max_str_len=1 << 24),
    None: Limits(max_bytes=DEFAULT_MAX_BYTES, max_objects=100_000),
}
_ALLOWED_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"}
)
_MAX_NDIM = 8
#: Payloads above this are decoded in a worker thread by ``decode_async``.
ASYNC_ABOVE_BYTES = 256 * 1024


class CodecError(ValueError):
    """A payload that is not what Nitro writes. ``reason`` is a short, countable label."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def _pack_ext(obj: Any) -> msgpack.ExtType:
    if isinstance(obj, np.ndarray):
        if obj.dtype.name not in _ALLOWED_DTYPES:
            raise TypeError(f"cannot encode arrays of dtype {obj.dtype}")
        arr = np.ascontiguousarray(obj)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        header = msgpack.packb([arr.dtype.name, list(arr.shape)])
        return msgpack.ExtType(_EXT_NDARRAY, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def encode(kind: str, body: Mapping[str, Any]) -> bytes:
    """Encode ``body`` as a payload of ``kind`` ("weights", "batch", ...)."""
    return msgpack.packb(
        {"schema": SCHEMA_VERSION, "kind": kind, "body": body},
        default=_pack_ext,
        use_bin_type=True,
    )


def _unpack_ext(code: int, data: bytes) -> Any:
    if code != _EXT_NDARRAY:
        raise CodecError("unknown_ext_type", f"extension type {code}")
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data) + 1)
    unpacker.feed(data)
    try:
        dtype_name, shape = unpacker.unpack()
    except Exception as exc:
        raise CodecError("bad_array_header", str(exc)) from exc
    offset = unpacker.tell()
    if not isinstance(dtype_name, str) or dtype_name not in _ALLOWED_DTYPES:
        raise CodecError("bad_dtype", f"dtype {dtype_name!r} is not allowed")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise CodecError("bad_shape", f"shape {shape!r}")
    dtype = np.dtype(dtype_name)
    expected = dtype.itemsize * math.prod(shape)  # Python ints: no overflow on hostile shapes
    found = len(data) - offset
    if expected != found:
        raise CodecError(
            "shape_mismatch", f"shape {shape} of {dtype_name} needs {expected} bytes, has {found}"
        )
    return np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape)


def limits_for(kind: str | None) -> Limits:
    return LIMITS.get(kind, LIMITS[None])


def decode(
    payload: bytes, *, kind: str | None = None, max_bytes: int | None = None
) -> dict[str, Any]:
    """Decode and validate a payload; return its body. Raises ``CodecError`` on anything else.

    ``max_bytes`` overrides the kind's byte cap."""
    limits = limits_for(kind)
    cap = limits.max_bytes if max_bytes is None else max_bytes
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError("not_bytes", type(payload).__name__)
    if len(payload) > cap:
        raise CodecError("too_large", f"{len(payload)} bytes > cap {cap}")
    if len(payload) >= 2 and payload[0] == 0x80 and payload[1] in range(2, 6):
        # Pickle protocols 2-5 start with PROTO (0x80) then the protocol number.
        raise CodecError("pickle_rejected", "payload looks like a Python pickle")
    scan(payload, limits)
    try:
        envelope = msgpack.unpackb(
            payload,
            raw=False,
            ext_hook=_unpack_ext,
            strict_map_key=True,
            max_str_len=limits.max_str_len,
            max_bin_len=cap,
            max_ext_len=cap,
            max_array_len=limits.max_objects,
            max_map_len=limits.max_objects,
        )
    except CodecError:
        raise
    except msgpack.ExtraData as exc:
        raise CodecError("trailing_bytes", str(exc)) from exc
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise CodecError("malformed_msgpack", str(exc)) from exc
    if not isinstance(envelope, dict) or "schema" not in envelope or "body" not in envelope:
        raise CodecError("bad_envelope", "expected a map with schema, kind and body")
    if envelope["schema"] != SCHEMA_VERSION:
        raise CodecError(
            "unknown_schema", f"schema {envelope['schema']!r}, this build reads {SCHEMA_VERSION}"
        )
    if kind is not None and envelope.get("kind") != kind:
        raise CodecError("wrong_kind", f"expected {kind!r}, found {envelope.get('kind')!r}")
    body = envelope["body"]
    if not isinstance(body, dict):
        raise CodecError("bad_envelope", "body is not a map")
    check_types(body)
    return body


async def decode_async(
    payload: bytes, *, kind: str | None = None, max_bytes: int | None = None
) -> dict[str, Any]:
    """``decode`` that keeps the event loop free: a large payload is decoded in a worker
    thread (a small one costs less than the thread hop)."""
    if len(payload) <= ASYNC_ABOVE_BYTES:
        return decode(payload, kind=kind, max_bytes=max_bytes)
    return await asyncio.to_thread(decode, payload, kind=kind, max_bytes=max_bytes)


#: msgpack type bytes: (header bytes after the type byte, length field bytes or 0).
_FIXED = {0xc0: 0, 0xc2: 0, 0xc3: 0, 0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8,
          0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8}
_SIZED = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}  # bin, str: length bytes
_EXT = {0xc7: 1, 0xc8: 2, 0xc9: 4}  # ext 8/16/32: length bytes, then the type byte
_FIXEXT = {0xd4: 1, 0xd5: 2, 0xd6: 4, 0xd7: 8, 0xd8: 16}
_CONTAINERS = {0xdc: (2, 1), 0xdd: (4, 1), 0xde: (2, 2), 0xdf: (4, 2)}  # (length bytes, x)
_UINT = {1: ">B", 2: ">H", 4: ">I"}


def scan(payload: bytes | bytearray | memoryview, limits: Limits) -> None:
    """Walk the msgpack headers without building anything: count objects and nesting, check
    declared lengths against the bytes present, and refuse extension types other than arrays
    (type -1 would arrive as a msgpack Timestamp). Cost: a few operations per object, and
    objects are capped, so a hostile payload is refused in milliseconds."""
    data = memoryview(payload)
    end = len(data)
    pos = objects = 0
    stack = [1]  # objects still to read at each open nesting level

    def length(at: int, size: int) -> int:
        if at + size > end:
            raise CodecError("malformed_msgpack", "truncated header")
        return struct.unpack_from(_UINT[size], data, at)[0]

    while stack:
        if stack[-1] == 0:
            stack.pop()
            continue
        stack[-1] -= 1
        if pos >= end:
            raise CodecError("malformed_msgpack", "truncated payload")
        objects += 1
        if objects > limits.max_objects:
            raise CodecError("too_many_objects", f"more than {limits.max_objects} objects")
        byte = data[pos]
        pos += 1
        children = 0
        if byte <= 0x7f or byte >= 0xe0:
            continue
        if byte <= 0x8f:
            children = 2 * (byte & 0x0f)
        elif byte <= 0x9f:
            children = byte & 0x0f
        elif byte <= 0xbf:
            pos += byte & 0x1f
        elif byte in _FIXED:
            pos += _FIXED[byte]
        elif byte in _SIZED:
            size = _SIZED[byte]
            pos += size + length(pos, size)
        elif byte in _EXT or byte in _FIXEXT:
            if byte in _EXT:
                size = _EXT[byte]
                n = length(pos, size)
                pos += size
            else:
                n = _FIXEXT[byte]
            if pos >= end:
                raise CodecError("malformed_msgpack", "truncated extension")
            code = struct.unpack_from(">b", data, pos)[0]
            if code != _EXT_NDARRAY:
                raise CodecError("unknown_ext_type", f"extension type {code}")
            pos += 1 + n
        elif byte in _CONTAINERS:
            size, per_item = _CONTAINERS[byte]
            children = per_item * length(pos, size)
            pos += size
        else:
            raise CodecError("malformed_msgpack", f"reserved type byte 0x{byte:02x}")
        if pos > end:
            raise CodecError("malformed_msgpack", "declared length beyond the payload")
        if children:
            if children > end - pos:  # every object takes at least one byte
                raise CodecError("malformed_msgpack", "container longer than the payload")
            if len(stack) > limits.max_depth:
                raise CodecError("malformed_msgpack", f"nesting deeper than {limits.max_depth}")
            stack.append(children)


_SCALARS = (str, bytes, int, float, bool, type(None), np.ndarray)


def check_types(body: Any) -> None:
    """Refuse any decoded value outside the schema's types (a map key must be a string)."""
    todo = [body]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise CodecError("bad_type", f"map key of type {type(key).__name__}")
                todo.append(item)
        elif isinstance(value, list):
            todo.extend(value)
        elif not isinstance(value, _SCALARS):
            raise CodecError("bad_type", f"value of type {type(value).__name__}")


def require(body: Mapping[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
    """Fetch a required field of a decoded body, raising ``CodecError`` if absent or mistyped."""
    if key not in body:
        raise CodecError("missing_field", key)
    value = body[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise CodecError("bad_field", f"{key} is {type(value).__name__}")
    return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)
