"""Fan-out cost: N invocations through the ``lambda`` backend (aiobotocore futures under a
concurrency cap) against the prototype's way (one OS process per call, each building a boto3
client), both against the same local Lambda endpoint running a trivial handler.

    .venv/bin/python perf/fanout.py            # 256 invocations, concurrency 64
    .venv/bin/python perf/fanout.py --quick    # 32 invocations, concurrency 16

Prints wall time of each way, the ratio (goal >= 20x), and learner-side CPU per invocation
(this process's CPU time / invocations; for the baseline, its child processes' CPU time).
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
        [sys.executable, "-m", "plugins.lambda_endpoint", "--port", str(port), "--handler",
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
    from plugins.actors_lambda import LambdaBackend
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 invocations, concurrency 16")
    parser.add_argument("-n", type=int, default=None, help="invocations (default 256)")
    parser.add_argument("--concurrency", type=int, default=None, help="default 64")
    args = parser.parse_args()
    n = args.n or (32 if args.quick else 256)
    concurrency = args.concurrency or (16 if args.quick else 64)
    sys.path.insert(0, str(ROOT))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    endpoint = start_endpoint(port, concurrency)
    try:
        wall, cpu, ok, throttles = asyncio.run(fan_out(url, n, concurrency))
        print(f"aiobotocore backend : {n} invocations (concurrency {concurrency}) in "
              f"{wall:.3f} s, {ok} ok, {throttles} throttles, "
              f"{n / wall:.0f} invokes/s, learner CPU {cpu / n * 1000:.2f} ms/invocation")
        t_before = throttled(url)
        p_wall, p_cpu, p_ok = prototype(url, n)
        print(f"process per invoke  : {n} invocations in {p_wall:.3f} s, {p_ok} ok, "
              f"{throttled(url) - t_before} throttles (boto3 retried them), "
              f"client-side CPU {p_cpu / n * 1000:.1f} ms/invocation")
        ratio = p_wall / wall
        print(f"speed-up            : {ratio:.1f}x (goal >= 20x)"
              f"{'' if ratio >= 20 else '  BELOW GOAL'}")
        print(f"CPU per invocation  : {p_cpu / max(cpu, 1e-9):.0f}x less on the learner side")
    finally:
        endpoint.terminate()
        endpoint.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
