"""Soak: many hundreds of short rounds through Redis and the local Lambda endpoint; is it flat?

A private redis-server and the local Lambda endpoint (the real actor function, warm workers)
start as subprocesses on free loopback ports; the engine runs in this process (CartPole, PPO,
tiny fragments, 2 actors, backend ``lambda``, transport ``redis``) for N rounds. Every
``--every`` rounds it samples, from an ``engine.events()`` subscriber:

- the learner's resident memory (this process, ``/proc/self/status`` VmRSS),
- the endpoint's resident memory (server process plus its forkserver and warm workers),
- Redis: ``DBSIZE``, keys without an expiry, the batch stream's length and pending entries,
  ``used_memory``.

It prints the samples and the growth per 100 rounds (least-squares slope after the first
sample, which includes warm-up). Goal: flat — keys and stream length constant, memory growth
near zero. Both subprocesses are stopped and the scratch folder removed at the end.

    .venv/bin/python perf/soak.py              # 3,000 rounds, sample every 100
    .venv/bin/python perf/soak.py --quick      # 600 rounds (< 1 minute)

The endpoint starts as ``python -m plugins.function.endpoint`` (same server and options): at the
time of writing ``python -m kernel lambda serve`` passes its dispatch function as the endpoint's
``--handler`` (both use the argparse dest ``handler``), so every invocation fails there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port}")


def rss_kib(pid: int | str = "self") -> int:
    """VmRSS of one process in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree(pid: int) -> list[int]:
    """The process and all its descendants (the endpoint's forkserver and workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
        except OSError:
            continue
    return out


def stop(proc: subprocess.Popen[bytes] | None, grace: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class Services:
    """redis-server and the Lambda endpoint as subprocesses; a context manager that always
    stops both and removes the scratch folder."""

    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self.tmp = Path(tempfile.mkdtemp(prefix="nitro-soak-"))
        self.redis_port, self.endpoint_port = free_port(), free_port()
        self.redis: subprocess.Popen[bytes] | None = None
        self.endpoint: subprocess.Popen[bytes] | None = None

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.endpoint_port}"

    def __enter__(self) -> Services:
        try:
            self.redis = subprocess.Popen(
                ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.tmp)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(self.redis_port, self.redis, "redis-server")
            from plugins.actors.local import PRELOAD

            self._endpoint_log = (self.tmp / "endpoint.log").open("wb")
            self.endpoint = subprocess.Popen(
                # Not "python -m kernel lambda serve": see the note in this module's docstring.
                [sys.executable, "-m", "plugins.function.endpoint", "--port",
                 str(self.endpoint_port), "--concurrency", str(self.concurrency),
                 "--timeout-s", "60", "--preload", ",".join(PRELOAD)],
                cwd=ROOT, env={**os.environ, "REDIS_URL": self.redis_url},
                stdout=subprocess.DEVNULL, stderr=self._endpoint_log)
            wait_port(self.endpoint_port, self.endpoint, "lambda endpoint")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        stop(self.endpoint)
        stop(self.redis, grace=5)
        if not os.environ.get("NITRO_SOAK_KEEP"):
            shutil.rmtree(self.tmp, ignore_errors=True)


def plan(services: Services, rounds: int, actors: int, steps: int) -> dict[str, Any]:
    return {
        "run": {"name": "soak", "seed": 1, "log_level": "warning"},
        "stop": {"max_rounds": rounds},
        "env": {"id": "CartPole-v1", "num_envs": 1, "normalize_obs": False,
                "normalize_reward": False},
        "algo": {"name": "ppo", "update_epochs": 1, "num_minibatches": 1},
        "actors": {"backend": "lambda", "count": actors, "steps": steps,
                   "endpoint_url": services.endpoint_url, "concurrency": actors,
                   "deadline_s": 10.0},
        "transport": {"kind": "redis", "url": services.redis_url},
        "checkpoint": {"enabled": False},
        "probes": [],
        "sinks": [],
    }


async def soak(args: argparse.Namespace, services: Services, out: Path) -> dict[str, Any]:
    import redis

    from kernel import events as ev
    from kernel.engine import Engine
    from kernel.logs import configure
    from plugins.transports.redis_stream import batches_key

    configure("warning")
    engine = Engine.from_plan(plan(services, args.rounds, args.actors, args.steps), out_dir=out)
    r = redis.Redis.from_url(services.redis_url)
    stream = batches_key(engine.run_id)
    samples: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def sample(round_number: int) -> None:
        assert services.endpoint is not None
        info = r.info("memory")
        pending = r.xpending(stream, "learners")["pending"] if r.exists(stream) else 0
        samples.append({
            "round": round_number, "t_s": round(time.perf_counter() - t0, 2),
            "learner_rss_mib": rss_kib() / 1024,
            "endpoint_rss_mib": sum(rss_kib(p) for p in tree(services.endpoint.pid)) / 1024,
            "redis_keys": r.dbsize(), "persistent_keys": persistent(r),
            "stream_len": r.xlen(stream), "pending": pending,
            "redis_used_mib": info["used_memory"] / 2**20,
        })

    async def watch() -> None:
        async for event in engine.events(types=(ev.RoundFinished,), maxsize=10_000):
            if event.round % args.every == 0 or event.round == 1:
                sample(event.round)

    async with engine:
        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)
        try:
            summary = await engine.run()
        finally:
            await asyncio.wait_for(watcher, timeout=10)
    r.close()
    return {"summary": summary, "samples": samples, "wall_s": time.perf_counter() - t0}


def persistent(r: Any) -> int:
    """Keys without an expiry: every key a run creates expires, so these are what could leak
    for good."""
    keys = list(r.scan_iter(count=1000))
    if not keys:
        return 0
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.ttl(key)
    return sum(1 for ttl in pipe.execute() if ttl == -1)


def slope_per_100(samples: list[dict[str, Any]], key: str) -> float:
    """Least-squares growth of ``key`` per 100 rounds, leaving out the warm-up sample."""
    pts = [(s["round"], s[key]) for s in samples[1:]]
    if len(pts) < 2:
        return 0.0
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    var = sum((x - mx) ** 2 for x, _ in pts)
    return 100 * sum((x - mx) * (y - my) for x, y in pts) / var if var else 0.0


def report(result: dict[str, Any]) -> None:
    samples, summary = result["samples"], result["summary"]
    cols = ["round", "t_s", "learner_rss_mib", "endpoint_rss_mib", "redis_keys",
            "persistent_keys", "stream_len", "pending", "redis_used_mib"]
    print(" ".join(f"{c:>16}" for c in cols))
    for s in samples:
        print(" ".join(f"{s[c]:>16.1f}" if isinstance(s[c], float) else f"{s[c]:>16}"
                       for c in cols))
    print()
    print(f"rounds {summary.get('rounds')}  stop {summary.get('stop_reason')}  "
          f"invocations {summary.get('invocations')}  errors {summary.get('invocation_errors')}"
          f"  rejected {summary.get('rejected_payloads')}  wall {result['wall_s']:.1f} s  "
          f"({summary.get('rounds', 0) / max(result['wall_s'], 1e-9):.1f} rounds/s)")
    for key in ("learner_rss_mib", "endpoint_rss_mib", "redis_used_mib", "redis_keys",
                "persistent_keys", "stream_len"):
        print(f"growth per 100 rounds  {key:<18} {slope_per_100(samples, key):+8.3f}")
    keys = [s["redis_keys"] for s in samples]
    kept = {s["persistent_keys"] for s in samples[1:]}
    print(f"redis keys over time: {keys}")
    print(f"keys without expiry: {sorted(kept)} ({'flat' if len(kept) <= 1 else 'NOT flat'}); "
          f"old weight versions are deleted once keep_versions newer ones exist, so the total "
          f"levels off at about keep_versions + 2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--every", type=int, default=100, help="sample every k rounds")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="env steps per actor per round")
    parser.add_argument("--quick", action="store_true", help="600 rounds, sample every 100")
    parser.add_argument("--json", type=Path, help="also write the samples here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.every = 600, 100
    if shutil.which("redis-server") is None:
        print("redis-server is not installed", file=sys.stderr)
        return 2
    with Services(concurrency=args.actors) as services:
        print(f"soak: {args.rounds} rounds x {args.actors} actors x {args.steps} steps, "
              f"redis :{services.redis_port}, endpoint :{services.endpoint_port}", flush=True)
        result = asyncio.run(soak(args, services, services.tmp / "run"))
    sys.path.insert(0, str(ROOT / "perf"))
    import common as c

    with c.printed() as text:
        report(result)
    c.write_result("soak", {
        "title": "Soak: learner memory and Redis keys over many rounds", "quick": args.quick,
        "markdown": f"```\n{text.getvalue().strip()}\n```", "rows": result["samples"],
        "summary": result["summary"], "wall_s": result["wall_s"]})
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["summary"].get("stop_reason") == "max_rounds" else 1


if __name__ == "__main__":
    raise SystemExit(main())
