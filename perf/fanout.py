"""Fan-out cost: N invocations through the ``lambda`` backend against the bare-SDK floor and the
prototype's way, all against the same local Lambda endpoint running a trivial handler.

- engine: ``LambdaBackend.invoke`` futures under its concurrency cap (retries, deadlines,
  receipts: everything a run pays per invocation);
- SDK floor: one aiobotocore client, ``asyncio.gather`` of the same invocations under the same
  cap, nothing else: what any Python caller of the Lambda API pays at least. engine / floor is
  the headline: near 1 means the engine adds nothing measurable over the SDK;
- prototype: one OS process per call, each building a boto3 client (what the prototype did;
  kept as history, measured fewer times because it is slow).

Each repetition runs engine and floor back to back (alternating which goes first); every
repetition is a row in ``perf/results/fanout.json`` and the tables are rendered from the rows.

    python perf/fanout.py            # 256 invocations, concurrency 64, 5 repetitions
    python perf/fanout.py --quick    # 32 invocations, concurrency 16, 2 repetitions
    python perf/fanout.py --render   # print the table of the stored rows
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402


def noop(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The trivial handler the endpoint runs (imported by its workers as perf.fanout:noop)."""
    return {"request_id": event.get("request_id", ""), "version": 0, "env_steps": 0,
            "episodes": 0, "duration_ms": 0.01, "cold_start": False}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def throttled(url: str) -> int:
    """Throttles the endpoint has answered so far (its non-AWS stats route)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/_nitro/stats", timeout=10) as reply:
        return int(json.loads(reply.read())["throttled"])


def start_endpoint(port: int, concurrency: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugins.function.endpoint", "--port", str(port), "--handler",
         "perf.fanout:noop", "--preload", "", "--concurrency", str(concurrency),
         "--retry-after-s", "0.05"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("endpoint did not start")


async def fan_out(url: str, n: int, concurrency: int) -> tuple[float, float, int, int]:
    """(wall s, CPU s, ok, throttles) of n invocations through the lambda backend."""
    from kernel.plan import ACTORS
    from kernel.roles import Invocation, PluginContext
    from kernel.schema import validate_table
    from plugins.actors.aws_lambda import LambdaBackend
    from plugins.descriptors.aws_lambda import LAMBDA_CONFIG

    cfg = validate_table("actors", {"backend": "lambda", "endpoint_url": url,
                                    "concurrency": concurrency, "max_retries": 50},
                         {**ACTORS, **LAMBDA_CONFIG})
    ctx = PluginContext(name="lambda", config=cfg, plan={}, run_id="perf", run_dir=None,
                        seed=0, bus=None)
    backend = LambdaBackend(ctx)
    await backend.start(ctx)
    try:
        async def one(i: int) -> Any:
            rid = f"perf-{i}"
            return await backend.invoke(Invocation(rid, 0, 1, {"request_id": rid}))

        await asyncio.gather(*(one(i) for i in range(concurrency)))  # warm the workers
        cpu0, t0 = time.process_time(), time.perf_counter()
        receipts = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await backend.close()
    ok = sum(1 for r in receipts if getattr(r, "ok", False))
    throttles = sum(getattr(r, "throttles", 0) for r in receipts)
    return wall, cpu, ok, throttles


async def sdk_floor(url: str, n: int, concurrency: int) -> tuple[float, float, int, int]:
    """(wall s, CPU s, ok, throttled) of n invocations through one bare aiobotocore client."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    config = AioConfig(retries={"total_max_attempts": 1, "mode": "standard"},
                       max_pool_connections=concurrency, read_timeout=60, connect_timeout=10)
    async with get_session().create_client(
            "lambda", endpoint_url=url, region_name="us-east-1", config=config,
            aws_access_key_id="x", aws_secret_access_key="x") as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> bool:
            async with gate:
                reply = await client.invoke(FunctionName="nitro-actor",
                                            Payload=json.dumps({"request_id": f"floor-{i}"}))
                await reply["Payload"].read()
                return not reply.get("FunctionError")

        await asyncio.gather(*(one(i) for i in range(concurrency)))  # warm, as the engine
        cpu0, t0 = time.process_time(), time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    errors = sum(1 for d in done if isinstance(d, BaseException))
    return wall, cpu, sum(1 for d in done if d is True), errors


def _prototype_call(url: str, i: int) -> None:
    """What the prototype did per invocation: a fresh process, a fresh boto3 client."""
    import boto3

    client = boto3.client("lambda", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x")
    reply = client.invoke(FunctionName="nitro-actor",
                          Payload=json.dumps({"request_id": f"proto-{i}"}))
    reply["Payload"].read()
    if reply.get("FunctionError"):
        raise SystemExit(1)


def prototype(url: str, n: int) -> tuple[float, float, int]:
    """(wall s, children's CPU s, ok) of n process-per-invoke calls, all started at once."""
    mp = multiprocessing.get_context("fork")
    before = os.times()
    t0 = time.perf_counter()
    procs = [mp.Process(target=_prototype_call, args=(url, i)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system
                                                          - before.children_system)
    return wall, cpu, sum(p.exitcode == 0 for p in procs)


WAYS = {"engine": "engine (LambdaBackend)", "sdk_floor": "bare-SDK floor (one aiobotocore "
        "client, gather)", "prototype": "prototype (a process + boto3 client per invoke)"}


def measure(url: str, way: str, n: int, concurrency: int, repeat: int) -> dict[str, Any]:
    """One repetition of one way, as a stored row."""
    row: dict[str, Any] = {"way": way, "seed": repeat, "n": n, "concurrency": concurrency}
    if way == "engine":
        wall, cpu, ok, throttles = asyncio.run(fan_out(url, n, concurrency))
        row.update(cpu_s=cpu, throttles=throttles)
    elif way == "sdk_floor":
        wall, cpu, ok, errors = asyncio.run(sdk_floor(url, n, concurrency))
        row.update(cpu_s=cpu, errors=errors)
    else:
        before = throttled(url)
        wall, cpu, ok = prototype(url, n)
        row.update(children_cpu_s=cpu, throttles=throttled(url) - before)
    row.update(wall_s=wall, ok=ok, invokes_per_s=n / wall)
    return row


def render(data: dict[str, Any]) -> str:
    """The section's Markdown, from the stored per-repetition rows only."""
    rows = data["rows"]
    by_way = {w: [r for r in rows if r["way"] == w] for w in WAYS}
    table = []
    for way, label in WAYS.items():
        mine = c.ok_rows(by_way[way])
        if not mine:
            continue
        cpu = [(r.get("cpu_s", r.get("children_cpu_s")) or 0) / r["n"] * 1000 for r in mine]
        table.append([label, len(mine), c.fmt(c.median([r["wall_s"] for r in mine]), 3)
                      + f" ({c.fmt(c.span([r['wall_s'] for r in mine]), 3)})",
                      c.median([r["invokes_per_s"] for r in mine]), c.median(cpu),
                      f"{sum(r['ok'] for r in mine)}/{sum(r['n'] for r in mine)}"])
    md = c.md_table(["way", "repetitions", "wall s, median (range) — lower is better",
                     "invokes/s — higher is better", "caller CPU ms/invocation — lower is better",
                     "ok"], table)
    _, headline = c.ratio_text(by_way["engine"], by_way["sdk_floor"], "wall_s",
                               ("engine", "sdk_floor"), unit="repetitions")
    # The prototype runs in fewer repetitions (it is slow): compare it on those only.
    proto_reps = {r["seed"] for r in c.ok_rows(by_way["prototype"])}
    _, history = c.ratio_text(by_way["prototype"],
                              [r for r in by_way["engine"] if r["seed"] in proto_reps],
                              "wall_s", ("prototype", "engine"), unit="repetitions")
    n, conc = rows[0]["n"], rows[0]["concurrency"]
    return (f"{n} invocations, concurrency {conc}, against one local endpoint running a no-op "
            f"handler.\n\n{md}\n\n- **engine / SDK floor, wall time** (lower is better, 1 = "
            f"no overhead over the bare SDK; same repetitions, 95% paired-bootstrap interval): "
            f"{headline}\n- prototype / engine, wall time (how much faster the engine is than "
            f"the prototype's way; goal >= 20; over the repetitions both ran): {history}\n\n"
            "The prototype's CPU is its child processes' (process start, imports, a boto3 "
            "client each); the others' is this process's own.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="32 invocations, concurrency 16, 2 repetitions")
    parser.add_argument("-n", type=int, default=None, help="invocations (default 256)")
    parser.add_argument("--concurrency", type=int, default=None, help="default 64")
    parser.add_argument("--repeats", type=int, default=None,
                        help="engine and floor repetitions (default 5; 2 with --quick)")
    parser.add_argument("--prototype-repeats", type=int, default=1,
                        help="repetitions of the prototype's way (slow: ~20 s each at 256)")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: print the table of the stored rows")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.render:
        print(render(json.loads((c.RESULTS / "fanout.json").read_text())))
        return 0
    n = args.n or (32 if args.quick else 256)
    concurrency = args.concurrency or (16 if args.quick else 64)
    repeats = args.repeats or (2 if args.quick else 5)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    endpoint = start_endpoint(port, concurrency)
    rows = []
    try:
        for rep in range(1, repeats + 1):
            ways = ["engine", "sdk_floor"] if rep % 2 else ["sdk_floor", "engine"]
            if rep <= args.prototype_repeats:
                ways.append("prototype")
            for way in ways:
                rows.append(measure(url, way, n, concurrency, rep))
                c.log(f"repeat {rep} {way}: {rows[-1]['wall_s']:.3f} s, {rows[-1]['ok']} ok")
    finally:
        endpoint.terminate()
        endpoint.wait(timeout=30)
    data = {"title": "Fan-out: the engine against the bare aiobotocore floor and the "
                     "prototype's process per invoke (issue 3)",
            "quick": args.quick, "rows": rows}
    print(render(data))
    c.write_result("fanout", data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
