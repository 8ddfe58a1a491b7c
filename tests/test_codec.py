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


def _empty_lists_payload(flat: bool) -> bytes:
    """~8 MiB of empty msgpack lists inside an honest envelope: each 1-byte 0x90 would
    become a Python list (~56 bytes plus its slot) if decoded."""
    n = 8 * 1024 * 1024
    if flat:
        lists = b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n  # one array32 of n lists
    else:
        # 2048 arrays of 4096 empty lists each: every single array is small.
        inner = b"\xdc" + (4096).to_bytes(2, "big") + b"\x90" * 4096
        lists = b"\xdc" + (2048).to_bytes(2, "big") + inner * 2048
    head = msgpack.packb({"schema": codec.SCHEMA_VERSION, "kind": "batch"})
    # Turn the 2-entry map into a 3-entry one and append "body": {"x": <lists>}.
    return bytes([0x83]) + head[1:] + msgpack.packb("body") + b"\x81" + \
        msgpack.packb("x") + lists


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "nested"])
def test_eight_mib_of_empty_lists_costs_little_time_and_memory(flat: bool) -> None:
    import time
    import tracemalloc

    payload = _empty_lists_payload(flat)
    assert len(payload) > 8 * 1024 * 1024
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(codec.CodecError) as info:
            codec.decode(payload, kind="batch")
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.reason == "too_many_objects"
    assert elapsed < 0.5, elapsed  # unguarded: ~4 s on the learner's event loop
    assert peak < 4 * 1024 * 1024, peak  # unguarded: ~585 MiB


def _nested(depth: int) -> list[object]:
    value: list[object] = [1]
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        # Ext type -1 is msgpack's Timestamp: refused, never decoded into one.
        (_payload({"t": 0}).replace(b"\xa1t\x00", b"\xa1t\xd6\xff\x00\x00\x00\x01"),
         "unknown_ext_type"),
        (_payload({"t": msgpack.Timestamp(1, 0)}), "unknown_ext_type"),
        (_payload({b"raw-key": 1}), "bad_type"),
        (_payload({"deep": _nested(40)}), "malformed_msgpack"),  # nesting over 32
        (_payload({"s": "x" * (2 << 20)}), "malformed_msgpack"),  # over max_str_len
        (_payload({"n": list(range(20_000))}), "too_many_objects"),
        (b"\x83" + b"\xc1", "malformed_msgpack"),  # reserved type byte
        (b"\xdd\xff\xff\xff\xff\x90", "malformed_msgpack"),  # claims 4 billion items
    ],
)
def test_container_and_type_limits(payload: bytes, reason: str) -> None:
    with pytest.raises(codec.CodecError) as info:
        codec.decode(payload, kind="batch")
    assert info.value.reason == reason


def test_each_kind_has_its_own_byte_cap() -> None:
    weights = codec.encode("weights", {"w": np.zeros(65 * 1024 * 1024, np.uint8)})
    with pytest.raises(codec.CodecError, match="too_large"):
        codec.decode(weights, kind="weights")
    assert codec.decode(weights, kind="weights", max_bytes=len(weights))["w"].nbytes == 65 * 1024 * 1024
    batch = codec.encode("batch", {"obs": np.zeros(65 * 1024 * 1024, np.uint8)})
    assert codec.decode(batch, kind="batch")["obs"].shape == (65 * 1024 * 1024,)


def test_decode_async_decodes_large_payloads_in_a_thread() -> None:
    import asyncio
    import threading

    seen: list[str] = []
    payload = codec.encode("batch", {"x": np.zeros(1 << 20, np.float32)})
    original = codec.check_types

    def spy(body: object) -> None:
        seen.append(threading.current_thread().name)
        original(body)

    codec.check_types = spy  # type: ignore[assignment]
    try:
        body = asyncio.run(codec.decode_async(payload, kind="batch"))
        small = asyncio.run(codec.decode_async(codec.encode("batch", {"n": 1}), kind="batch"))
    finally:
        codec.check_types = original  # type: ignore[assignment]
    assert body["x"].shape == (1 << 20,) and small == {"n": 1}
    assert seen[0] != threading.main_thread().name and seen[1] == threading.main_thread().name
