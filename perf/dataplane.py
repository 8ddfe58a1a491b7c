"""Data-plane throughput through Redis: Nitro's transport against the prototype's way.

Nitro: the learner encodes weights once with the codec (msgpack + raw numpy bytes) and SETs
them under a version key; N actors GET and decode them; each actor encodes a rollout batch and
XADDs it to the run's stream; the learner collects them with XREADGROUP (blocking), decodes
and acknowledges (``plugins.transports.redis_stream``: the real RedisTransport and
ActorRedisClient).

Prototype: ``pickle.dumps`` of the same dicts into a Redis hash (HSET); actors poll HGET for the
weights; the learner polls HGETALL until all N batches are there, then unpickles. Both poll with
a sleep of ``--poll-ms`` (5 ms by default) between tries, as a sensible polling client would: a
loop without a sleep would inflate the baseline's CPU and command counts, and a longer sleep
would slow its throughput rows.

A last pair of rows spreads the actors' pushes over time (``--stagger-ms`` apart, as actors
finish rollouts at different moments): both ways then take the same wall time, and the rows
show the CPU (this process + redis-server) and Redis commands each burns while waiting.

Both run against a private redis-server on a free port started here (killed at exit), with the
N actors as threads of this process (one connection each), so both ways pay the same GIL and
loopback costs. Every repetition is a row in ``perf/results/dataplane.json``; the table shows
medians and the ratio Nitro / prototype of each row's quantity, with which direction is better
(throughputs: higher; CPU and commands: lower).

    python perf/dataplane.py            # 32 actors, 5 repetitions
    python perf/dataplane.py --quick    # 8 actors, 2 repetitions
    python perf/dataplane.py --render   # print the table of the stored rows
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import pickle  # the prototype's way, measured as the baseline; never used by Nitro itself
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

from kernel import codec  # noqa: E402
from kernel.roles import PluginContext  # noqa: E402
from plugins.transports.redis_stream import ActorRedisClient, RedisTransport  # noqa: E402

# -- payloads -------------------------------------------------------------------------------

def mlp_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Hopper-sized actor-critic MLP (obs 11, actions 3, 64x64): ~10k float32 parameters."""
    shapes = {"actor.0.weight": (64, 11), "actor.0.bias": (64,), "actor.2.weight": (64, 64),
              "actor.2.bias": (64,), "actor.4.weight": (3, 64), "actor.4.bias": (3,),
              "log_std": (3,), "critic.0.weight": (64, 11), "critic.0.bias": (64,),
              "critic.2.weight": (64, 64), "critic.2.bias": (64,), "critic.4.weight": (1, 64),
              "critic.4.bias": (1,)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def cnn_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Nature-CNN actor-critic for Atari (4x84x84 input, 6 actions): ~1.7M float32 params."""
    shapes = {"conv1.weight": (32, 4, 8, 8), "conv1.bias": (32,), "conv2.weight": (64, 32, 4, 4),
              "conv2.bias": (64,), "conv3.weight": (64, 64, 3, 3), "conv3.bias": (64,),
              "fc.weight": (512, 3136), "fc.bias": (512,), "actor.weight": (6, 512),
              "actor.bias": (6,), "critic.weight": (1, 512), "critic.bias": (1,)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def rollout_batch(rng: np.random.Generator, index: int, steps: int = 128, envs: int = 8,
                  obs: int = 11, act: int = 3) -> dict[str, Any]:
    """A Hopper rollout fragment as the handler pushes it (docs/contracts.md)."""
    f32 = np.float32
    data = {
        "obs": rng.standard_normal((steps, envs, obs)).astype(f32),
        "actions": rng.standard_normal((steps, envs, act)).astype(f32),
        "logprobs": rng.standard_normal((steps, envs)).astype(f32),
        "values": rng.standard_normal((steps, envs)).astype(f32),
        "rewards": rng.standard_normal((steps, envs)).astype(f32),
        "terminated": rng.random((steps, envs)) < 0.01,
        "truncated": np.zeros((steps, envs), bool),
        "bootstrap_values": np.zeros((steps, envs), f32),
        "last_obs": rng.standard_normal((envs, obs)).astype(f32),
        "last_values": rng.standard_normal(envs).astype(f32),
    }
    return {"run_id": "perf", "request_id": f"perf-a{index}", "version": 1,
            "env_steps": steps * envs, "episode_returns": rng.standard_normal(3).astype(f32),
            "episode_lengths": np.full(3, 300, np.int64),
            "stats": {"obs_stats": {"mean": np.zeros(obs), "var": np.ones(obs), "count": 1.0}},
            "data": data, "receipt": {"duration_ms": 1000.0, "cold_start": False}}


def nbytes(tree: Any) -> int:
    if isinstance(tree, np.ndarray):
        return tree.nbytes
    if isinstance(tree, dict):
        return sum(nbytes(v) for v in tree.values())
    return 0


# -- a private redis-server -----------------------------------------------------------------

def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="nitro-perf-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )

    def stop() -> None:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)

    atexit.register(stop)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    sys.exit("redis-server did not start")


# -- Nitro ------------------------------------------------------------------------------------

class Nitro:
    def __init__(self, url: str, n: int, pool: ThreadPoolExecutor):
        self.url, self.n, self.pool = url, n, pool
        self.run_id = f"perf-{secrets.token_hex(4)}"
        ctx = PluginContext(name="redis", config={"url": url, "read_count": 64}, plan={},
                            run_id=self.run_id, run_dir=None, seed=0, bus=None)
        self.transport = RedisTransport(ctx)
        self.actors = [ActorRedisClient(url, weights_wait_s=0) for _ in range(n)]
        self.version = 0

    async def start(self) -> None:
        await self.transport.start(None)  # type: ignore[arg-type]

    async def broadcast(self, weights: dict[str, np.ndarray]) -> float:
        loop = asyncio.get_running_loop()
        self.version += 1
        version = self.version
        ready, invoked = threading.Barrier(self.n + 1), threading.Event()

        def fetch(i: int) -> None:
            ready.wait()
            invoked.wait()  # an actor is invoked once the version is published
            body = codec.decode(self.actors[i].fetch_weights(self.run_id, version),
                                kind="weights")
            assert body["version"] == version

        fetches = [loop.run_in_executor(self.pool, fetch, i) for i in range(self.n)]
        await asyncio.to_thread(ready.wait)  # all actor threads up, as in the prototype's run
        t0 = time.perf_counter()
        payload = codec.encode("weights", {"version": version, "weights": weights})
        await self.transport.publish_weights(version, payload)
        invoked.set()
        await asyncio.gather(*fetches)
        return time.perf_counter() - t0

    async def collect(self, batches: list[dict[str, Any]], stagger_s: float = 0.0) -> float:
        loop = asyncio.get_running_loop()

        def push(i: int) -> None:
            time.sleep(i * stagger_s)  # actors finish their rollouts at different times
            self.actors[i].push_batch(self.run_id, codec.encode("batch", batches[i]))

        t0 = time.perf_counter()
        pushes = [loop.run_in_executor(self.pool, push, i) for i in range(self.n)]
        got, ids = [], []
        while len(got) < self.n:
            message = await self.transport.next_batch(5.0)
            if message is None:
                raise RuntimeError("a batch did not arrive")
            ids.append(message[0])
            got.append(codec.decode(message[1], kind="batch"))
        await self.transport.ack(ids)
        elapsed = time.perf_counter() - t0
        await asyncio.gather(*pushes)
        return elapsed

    async def close(self) -> None:
        await self.transport.close()
        for actor in self.actors:
            actor.close()


# -- the prototype's way -------------------------------------------------------------------------

class Prototype:
    def __init__(self, url: str, n: int, pool: ThreadPoolExecutor, poll_s: float):
        self.n, self.pool, self.poll_s = n, pool, poll_s
        self.learner = redis.Redis.from_url(url)
        self.actors = [redis.Redis.from_url(url) for _ in range(n)]
        self.key = f"proto-{secrets.token_hex(4)}"

    def broadcast(self, weights: dict[str, np.ndarray]) -> float:
        self.learner.delete(f"{self.key}:weights")
        polling = threading.Barrier(self.n + 1)

        def poll(i: int) -> None:
            polling.wait()
            while True:  # poll, sleeping between tries
                raw = self.actors[i].hget(f"{self.key}:weights", "state")
                if raw is not None:
                    pickle.loads(raw)  # noqa: S301 -- the baseline being measured
                    return
                time.sleep(self.poll_s)

        futures = [self.pool.submit(poll, i) for i in range(self.n)]
        polling.wait()
        t0 = time.perf_counter()
        self.learner.hset(f"{self.key}:weights", "state", pickle.dumps(weights))
        for future in futures:
            future.result()
        return time.perf_counter() - t0

    def collect(self, batches: list[dict[str, Any]], stagger_s: float = 0.0) -> float:
        key = f"{self.key}:batches"

        def push(i: int) -> None:
            time.sleep(i * stagger_s)
            self.actors[i].hset(key, f"a{i}", pickle.dumps(batches[i]))

        t0 = time.perf_counter()
        futures = [self.pool.submit(push, i) for i in range(self.n)]
        while True:  # poll until every actor's batch is in the hash
            found = self.learner.hgetall(key)
            if len(found) >= self.n:
                break
            time.sleep(self.poll_s)
        [pickle.loads(raw) for raw in found.values()]  # noqa: S301 -- the baseline
        self.learner.delete(key)
        elapsed = time.perf_counter() - t0
        for future in futures:
            future.result()
        return elapsed

    def close(self) -> None:
        for client in (self.learner, *self.actors):
            client.close()


# -- driver -----------------------------------------------------------------------------------

class Cost:
    """CPU seconds (this process + redis-server) and Redis commands spent inside a block."""

    def __init__(self, url: str):
        self.info = redis.Redis.from_url(url)

    def snapshot(self) -> tuple[float, float, int]:
        info = self.info.info()
        return (time.process_time(), info["used_cpu_user"] + info["used_cpu_sys"],
                info["total_commands_processed"])

    @staticmethod
    def since(before: tuple[float, float, int], after: tuple[float, float, int]
              ) -> tuple[float, int]:
        return (after[0] - before[0]) + (after[1] - before[1]), after[2] - before[2]


def row(phase: str, unit: str, better: str, way: str, rep: int, value: float) -> dict[str, Any]:
    return {"phase": phase, "unit": unit, "better": better, "way": way, "seed": rep,
            "value": value}


async def measure(url: str, n: int, reps: int, stagger_s: float, poll_s: float
                  ) -> list[dict[str, Any]]:
    """Per-repetition rows (the first call of each way is a warm-up, not stored)."""
    rng = np.random.default_rng(0)
    payloads = {"hopper-mlp": mlp_weights(rng), "atari-cnn": cnn_weights(rng)}
    batches = [rollout_batch(rng, i) for i in range(n)]
    rows: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=n) as pool:
        nitro, proto = Nitro(url, n, pool), Prototype(url, n, pool, poll_s)
        await nitro.start()
        try:
            for name, weights in payloads.items():
                params = sum(a.size for a in weights.values())
                phase = f"weights {name} ({params / 1e6:.2f}M params) -> {n} actors"
                mb = n * nbytes(weights) / 1e6
                await nitro.broadcast(weights)
                await asyncio.to_thread(proto.broadcast, weights)
                for rep in range(1, reps + 1):
                    rows.append(row(phase, "MB/s", "higher", "nitro", rep,
                                    mb / await nitro.broadcast(weights)))
                    rows.append(row(phase, "MB/s", "higher", "prototype", rep,
                                    mb / await asyncio.to_thread(proto.broadcast, weights)))
            phase = f"batches {n} x 128 steps x 8 envs ({nbytes(batches[0]) / 1e3:.0f} KB each)"
            await nitro.collect(batches)
            await asyncio.to_thread(proto.collect, batches)
            for rep in range(1, reps + 1):
                rows.append(row(phase, "batches/s", "higher", "nitro", rep,
                                n / await nitro.collect(batches)))
                rows.append(row(phase, "batches/s", "higher", "prototype", rep,
                                n / await asyncio.to_thread(proto.collect, batches)))
            # Actors finishing over time (the usual case): the prototype's learner polls all
            # along. Same wall time for both; what differs is the CPU and Redis load.
            cost = Cost(url)
            spread = f"batches over {n * stagger_s * 1000:.0f} ms"
            for rep in range(1, reps + 1):
                before = cost.snapshot()
                await nitro.collect(batches, stagger_s)
                cpu, cmds = cost.since(before, cost.snapshot())
                rows.append(row(f"{spread}: CPU (learner+actors+redis)", "ms CPU", "lower",
                                "nitro", rep, cpu * 1000))
                rows.append(row(f"{spread}: Redis commands", "commands", "lower", "nitro", rep,
                                cmds))
                before = cost.snapshot()
                await asyncio.to_thread(proto.collect, batches, stagger_s)
                cpu, cmds = cost.since(before, cost.snapshot())
                rows.append(row(f"{spread}: CPU (learner+actors+redis)", "ms CPU", "lower",
                                "prototype", rep, cpu * 1000))
                rows.append(row(f"{spread}: Redis commands", "commands", "lower", "prototype",
                                rep, cmds))
            cost.info.close()
        finally:
            await nitro.close()
            proto.close()
    return rows


def render(data: dict[str, Any]) -> str:
    """The section's Markdown, from the stored per-repetition rows only."""
    rows = data["rows"]
    phases = list(dict.fromkeys(r["phase"] for r in rows))
    table = []
    for phase in phases:
        mine = [r for r in rows if r["phase"] == phase]
        nitro = [r for r in mine if r["way"] == "nitro"]
        proto = [r for r in mine if r["way"] == "prototype"]
        _, cell = c.ratio_text(nitro, proto, "value", ("nitro", "prototype"),
                               unit="repetitions")
        table.append([phase, mine[0]["unit"], f"{mine[0]['better']} is better",
                      c.fmt(c.median([r["value"] for r in nitro]), 1),
                      c.fmt(c.median([r["value"] for r in proto]), 1), cell])
    md = c.md_table(["measure", "unit", "direction", "nitro (median)", "prototype (median)",
                     "nitro / prototype [95% interval]"], table)
    return (f"{data['actors']} actors (threads), {data['reps']} repetitions after a warm-up; "
            f"the prototype polls every {data['poll_ms']:g} ms (a sleep between tries), "
            f"pushes in the spread rows {data['stagger_ms']:g} ms apart. Throughputs are "
            "stated one way (higher is better); ratios are Nitro's over the prototype's, so a "
            "throughput ratio above 1 and a CPU or command ratio below 1 favour Nitro.\n\n"
            + md)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--stagger-ms", type=float, default=10.0,
                        help="gap between actors' pushes in the staggered rows")
    parser.add_argument("--poll-ms", type=float, default=5.0,
                        help="the prototype's sleep between polls")
    parser.add_argument("--quick", action="store_true", help="8 actors, 2 repetitions")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: print the table of the stored rows")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads((c.RESULTS / "dataplane.json").read_text())))
        return
    n, reps = (8, 2) if args.quick else (args.actors, args.reps)
    _, url = start_redis()
    c.log(f"redis-server {url}; {n} actors (threads); {reps} repetitions")
    rows = asyncio.run(measure(url, n, reps, args.stagger_ms / 1000, args.poll_ms / 1000))
    data = {"title": "Data plane: weights and batches through Redis vs pickle-in-a-hash "
                     "polling (issue 3)", "quick": args.quick, "actors": n, "reps": reps,
            "poll_ms": args.poll_ms, "stagger_ms": args.stagger_ms, "rows": rows}
    print(render(data))
    c.write_result("dataplane", data)


if __name__ == "__main__":
    main()
