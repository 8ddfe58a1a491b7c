"""The wire format round-trips arrays without copies and rejects everything it did not write."""

from __future__ import annotations

import pickle

import msgpack
import numpy as np
import pytest

from kernel import codec

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_allowed_dtype(dtype: str) -> None:
    arr = (np.arange(24) % 3).astype(dtype).reshape(2, 3, 4)
    body = codec.decode(codec.encode("batch", {"x": arr, "n": 3, "nested": {"y": arr[0]}}))
    assert body["x"].dtype == np.dtype(dtype) and body["x"].shape == (2, 3, 4)
    np.testing.assert_array_equal(body["x"], arr)
    np.testing.assert_array_equal(body["nested"]["y"], arr[0])
    assert body["n"] == 3


def test_decoded_arrays_are_read_only_views() -> None:
    arr = np.random.default_rng(0).random((64, 64)).astype(np.float32)
    out = codec.decode(codec.encode("weights", {"w": arr}))["w"]
    assert not out.flags.writeable  # frombuffer: zero-copy, so it must not be mutated
    assert out.base is not None


def test_non_contiguous_and_empty_arrays() -> None:
    arr = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]
    empty = np.zeros((0, 3), dtype=np.float32)
    body = codec.decode(codec.encode("batch", {"a": arr, "e": empty}))
    np.testing.assert_array_equal(body["a"], arr)
    assert body["e"].shape == (0, 3)


def test_encode_refuses_object_arrays() -> None:
    with pytest.raises(TypeError):
        codec.encode("batch", {"x": np.array([object()], dtype=object)})


def _ext(dtype: str, shape: list[int], raw: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(1, msgpack.packb([dtype, shape]) + raw)


def _payload(body: object, schema: int = codec.SCHEMA_VERSION) -> bytes:
    return msgpack.packb({"schema": schema, "kind": "batch", "body": body}, use_bin_type=True)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (_payload({"x": _ext("object", [1], b"\0" * 8)}), "bad_dtype"),
        (_payload({"x": _ext("<U4", [1], b"\0" * 16)}), "bad_dtype"),
        (_payload({"x": _ext("float32", [4, 4], b"\0" * 60)}), "shape_mismatch"),
        (_payload({"x": _ext("float32", [-1], b"")}), "bad_shape"),
        (_payload({"x": _ext("float32", [1] * 12, b"\0" * 4)}), "bad_shape"),
        (_payload({"x": msgpack.ExtType(9, b"junk")}), "unknown_ext_type"),
        (_payload({"x": 1}, schema=99), "unknown_schema"),
        (_payload([1, 2, 3]), "bad_envelope"),
        (msgpack.packb([1, 2]), "bad_envelope"),
        (pickle.dumps({"weights": np.zeros(3)}), "pickle_rejected"),
        (codec.encode("batch", {"x": np.zeros(100)})[:-7], "malformed_msgpack"),
        (codec.encode("batch", {"x": 1}) + b"\x01", "trailing_bytes"),
        (b"", "malformed_msgpack"),
    ],
)
def test_hostile_payloads_are_rejected_with_a_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(codec.CodecError) as info:
        codec.decode(payload)
    assert info.value.reason == reason


def test_size_cap_and_kind() -> None:
    payload = codec.encode("batch", {"x": np.zeros(1000)})
    with pytest.raises(codec.CodecError, match="too_large"):
        codec.decode(payload, max_bytes=100)
    with pytest.raises(codec.CodecError, match="wrong_kind"):
        codec.decode(payload, kind="weights")


def test_declared_shape_cannot_claim_more_than_it_carries() -> None:
    # A 4 GiB claim backed by 8 bytes must fail on arithmetic, not on allocation.
    with pytest.raises(codec.CodecError, match="shape_mismatch"):
        codec.decode(_payload({"x": _ext("float64", [1 << 29], b"\0" * 8)}))


def test_require() -> None:
    with pytest.raises(codec.CodecError, match="missing_field"):
        codec.require({}, "version", int)
    with pytest.raises(codec.CodecError, match="bad_field"):
        codec.require({"version": True}, "version", int)
    assert codec.require({"version": 3}, "version", int) == 3
