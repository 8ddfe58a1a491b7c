"""Load: push the Lambda endpoint and the Redis transport to their limits; print what held.

1. **Invocations**: a trivial handler behind the local Lambda endpoint (``--endpoint-concurrency``
   warm workers); the ``lambda`` backend (aiobotocore) fires N invocations with 8, 32, 128, 256
   in flight. More in flight than the endpoint's concurrency gets 429s, which the backend
   retries with jittered backoff. Per level: throughput, p50/p99 latency of a whole invocation
   (retries included), throttles, failures.
2. **Redis data plane**: P producers XADD batch-sized payloads to one stream while one consumer
   reads it through a consumer group (XREADGROUP, then XACK + XDEL, as the learner does). Per
   level: entries/s, MB/s, XADD p50/p99, end-to-end p50/p99 (producer to consumer), peak
   stream length, errors.

"Broke" is the first level with failures, or whose throughput fell below 80 % of the best
level before it. Everything runs on 127.0.0.1 with private subprocesses that are stopped at
the end.

    .venv/bin/python perf/load.py             # levels 8..256, 64 KiB and 512 KiB payloads
    .venv/bin/python perf/load.py --quick     # fewer calls and levels (< 1 minute)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.soak import free_port, stop, wait_port  # noqa: E402


def noop(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The trivial handler the endpoint runs (its workers import it as perf.load:noop)."""
    return {"request_id": event.get("request_id", ""), "version": 0, "env_steps": 0,
            "episodes": 0, "duration_ms": 0.01, "cold_start": False}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def broke(rows: list[dict[str, Any]], key: str) -> str:
    best = 0.0
    for row in rows:
        if row["errors"]:
            return f"level {row['level']}: {row['errors']} failures"
        if best and row[key] < 0.8 * best:
            return f"level {row['level']}: throughput {row[key]:.0f} < 80% of best {best:.0f}"
        best = max(best, row[key])
    return "nothing broke at these levels"


# -- invocations ---------------------------------------------------------------------------------

async def invoke_level(url: str, in_flight: int, calls: int) -> dict[str, Any]:
    from kernel.plan import ACTORS
    from kernel.roles import Invocation, PluginContext
    from kernel.schema import validate_table
    from plugins.actors.aws_lambda import LambdaBackend
    from plugins.descriptors.aws_lambda import LAMBDA_CONFIG

    cfg = validate_table("actors", {"backend": "lambda", "endpoint_url": url,
                                    "concurrency": in_flight, "max_retries": 100,
                                    "backoff_s": 0.01, "backoff_max_s": 0.5,
                                    "invoke_deadline_s": 120.0},
                         {**ACTORS, **LAMBDA_CONFIG})
    ctx = PluginContext(name="lambda", config=cfg, plan={}, run_id="load", run_dir=None,
                        seed=0, bus=None)
    backend = LambdaBackend(ctx)
    await backend.start(ctx)
    latencies: list[float] = []

    async def one(i: int) -> Any:
        rid = f"load-{in_flight}-{i}"
        t0 = time.perf_counter()
        try:
            return await backend.invoke(Invocation(rid, 0, 1, {"request_id": rid}))
        finally:
            latencies.append(time.perf_counter() - t0)

    try:
        await asyncio.gather(*(one(-i - 1) for i in range(min(in_flight, 16))),
                             return_exceptions=True)  # warm connections and workers
        latencies.clear()
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(calls)), return_exceptions=True)
        wall = time.perf_counter() - t0
    finally:
        await backend.close()
    ok = sum(1 for r in results if getattr(r, "ok", False))
    return {
        "level": in_flight, "calls": calls, "ok": ok, "errors": calls - ok,
        "per_s": calls / wall, "p50_ms": 1000 * pct(latencies, 0.5),
        "p99_ms": 1000 * pct(latencies, 0.99),
        "throttles": sum(getattr(r, "throttles", 0) for r in results),
        "first_error": next((str(r)[:120] for r in results if not getattr(r, "ok", False)), ""),
    }


def invocations(levels: list[int], calls: int, concurrency: int) -> list[dict[str, Any]]:
    import subprocess

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugins.function.endpoint", "--port", str(port), "--handler",
         "perf.load:noop", "--preload", "", "--concurrency", str(concurrency),
         "--retry-after-s", "0.05"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    rows = []
    try:
        wait_port(port, proc, "lambda endpoint")
        for level in levels:
            row = asyncio.run(invoke_level(f"http://127.0.0.1:{port}", level,
                                           max(calls, 2 * level)))
            rows.append(row)
            print(f"  invoke  in-flight {level:>4}: {row['per_s']:8.0f}/s  p50 "
                  f"{row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  throttles "
                  f"{row['throttles']:>6}  failed {row['errors']}", flush=True)
    finally:
        stop(proc)
    return rows


# -- Redis -------------------------------------------------------------------------------------

async def redis_level(url: str, producers: int, per_producer: int, size: int) -> dict[str, Any]:
    import redis.asyncio as aioredis

    stream, group = f"nitro:load-{producers}-{size}:batches", "learners"
    r = aioredis.Redis.from_url(url, max_connections=producers + 4)
    await r.xgroup_create(stream, group, id="0", mkstream=True)
    total = producers * per_producer
    add_ms: list[float] = []
    e2e_ms: list[float] = []
    errors = 0
    peak = 0
    filler = os.urandom(size - 8)

    async def produce() -> None:
        nonlocal errors
        for _ in range(per_producer):
            t0 = time.perf_counter()
            try:
                await r.xadd(stream, {b"p": struct.pack("<d", time.time()) + filler},
                             maxlen=100_000, approximate=True)
            except Exception:
                errors += 1
                continue
            add_ms.append(1000 * (time.perf_counter() - t0))

    async def consume() -> None:
        nonlocal peak
        seen = 0
        idle_since = time.monotonic()
        while seen < total - errors and time.monotonic() - idle_since < 10:
            reply = await r.xreadgroup(group, "learner", {stream: ">"}, count=64, block=200)
            entries = [(mid, f) for _s, items in reply or [] for mid, f in items]
            if not entries:
                continue
            idle_since = time.monotonic()
            now = time.time()
            for _mid, fields in entries:
                e2e_ms.append(1000 * (now - struct.unpack("<d", fields[b"p"][:8])[0]))
            ids = [mid for mid, _ in entries]
            async with r.pipeline(transaction=False) as pipe:
                pipe.xack(stream, group, *ids)
                pipe.xdel(stream, *ids)
                pipe.xlen(stream)
                peak = max(peak, (await pipe.execute())[-1] + len(ids))
            seen += len(entries)

    t0 = time.perf_counter()
    await asyncio.gather(consume(), *(produce() for _ in range(producers)))
    wall = time.perf_counter() - t0
    left = await r.xlen(stream)
    await r.delete(stream)
    await r.aclose()
    per_s = len(e2e_ms) / wall
    return {"level": producers, "size": size, "entries": total, "received": len(e2e_ms),
            "errors": errors + (total - errors - len(e2e_ms)), "per_s": per_s,
            "mb_s": per_s * size / 1e6, "add_p50_ms": pct(add_ms, 0.5),
            "add_p99_ms": pct(add_ms, 0.99), "e2e_p50_ms": pct(e2e_ms, 0.5),
            "e2e_p99_ms": pct(e2e_ms, 0.99), "peak_len": peak, "left": left}


def redis_load(levels: list[int], sizes: list[int], entries: int) -> list[dict[str, Any]]:
    import subprocess
    import tempfile

    port = free_port()
    tmp = tempfile.mkdtemp(prefix="nitro-load-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_port(port, proc, "redis-server")
        for size in sizes:
            for level in levels:
                per = max(1, entries // level)
                row = asyncio.run(redis_level(f"redis://127.0.0.1:{port}/0", level, per, size))
                rows.append(row)
                print(f"  redis {size // 1024:>4} KiB x {level:>4} producers: "
                      f"{row['per_s']:7.0f}/s {row['mb_s']:7.1f} MB/s  xadd p50 "
                      f"{row['add_p50_ms']:6.2f} p99 {row['add_p99_ms']:7.2f} ms  e2e p50 "
                      f"{row['e2e_p50_ms']:7.1f} p99 {row['e2e_p99_ms']:7.1f} ms  peak len "
                      f"{row['peak_len']:>5}  errors {row['errors']}", flush=True)
    finally:
        stop(proc, grace=5)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--endpoint-concurrency", type=int, default=16,
                        help="the endpoint's warm workers (its reserved concurrency)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    from kernel.logs import configure

    configure("warning")
    if args.quick:
        inv_levels, calls, conc = [8, 32, 128, 256], 256, 4
        redis_levels, sizes, entries = [1, 8, 32, 128], [64 * 1024], 1024
    else:
        inv_levels, calls, conc = [8, 32, 128, 256, 512], 2048, args.endpoint_concurrency
        redis_levels, sizes, entries = [1, 8, 32, 128, 256], [64 * 1024, 512 * 1024], 4096
    sys.path.insert(0, str(ROOT / "perf"))
    import common as c

    with c.printed() as text:
        print(f"invocations: trivial handler, endpoint concurrency {conc}", flush=True)
        inv = invocations(inv_levels, calls, conc)
        print(f"  held: {broke(inv, 'per_s')}")
        print("redis: producers XADD, one consumer XREADGROUP + XACK + XDEL", flush=True)
        red = redis_load(redis_levels, sizes, entries)
        for size in sizes:
            print(f"  held ({size // 1024} KiB): "
                  f"{broke([r for r in red if r['size'] == size], 'per_s')}")
    if args.json:
        args.json.write_text(json.dumps({"invocations": inv, "redis": red}, indent=1))
    c.write_result("load", {
        "title": "Load: the Lambda endpoint and the Redis transport at rising concurrency",
        "quick": args.quick, "markdown": f"```\n{text.getvalue().strip()}\n```",
        "rows": [{"part": "invocations", **r} for r in inv]
        + [{"part": "redis", **r} for r in red]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
