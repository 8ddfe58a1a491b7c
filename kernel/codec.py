"""The wire format of the data plane: msgpack with a numpy extension type, validated on decode.

Whoever can write to Redis or to a function's input must not be able to run code on the
learner, so there is no pickle here: a payload is plain msgpack, arrays travel as (dtype,
shape, raw bytes) and are rebuilt with ``numpy.frombuffer`` (zero-copy, read-only) only after
the dtype is on a whitelist and the shape matches the byte count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

#: Bumped whenever the envelope or the array encoding changes incompatibly.
SCHEMA_VERSION = 1
_EXT_NDARRAY = 1
#: Default cap on one payload: Lambda's synchronous payload limit is 6 MB, but batches
#: through Redis may be larger (Atari fragments); 256 MiB still stops a hostile 4 GiB claim.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
_ALLOWED_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"}
)
_MAX_NDIM = 8


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


def decode(
    payload: bytes, *, kind: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """Decode and validate a payload; return its body. Raises ``CodecError`` on anything else."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError("not_bytes", type(payload).__name__)
    if len(payload) > max_bytes:
        raise CodecError("too_large", f"{len(payload)} bytes > cap {max_bytes}")
    if len(payload) >= 2 and payload[0] == 0x80 and payload[1] in range(2, 6):
        # Pickle protocols 2-5 start with PROTO (0x80) then the protocol number.
        raise CodecError("pickle_rejected", "payload looks like a Python pickle")
    try:
        envelope = msgpack.unpackb(
            payload,
            raw=False,
            ext_hook=_unpack_ext,
            strict_map_key=True,
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
    return body


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
