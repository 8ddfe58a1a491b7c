"""The actor function refuses what its learner's validated plan could not have produced.

Each case posts a hostile event to ``lambda serve`` running the real ``plugins.function.handler`` in
real worker processes, and checks that the function refused it with the expected reason
(counted by the endpoint), and that nothing happened that the event asked for: no connection to
a host it named, no import of a module it named.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.function import handler as actor_function
from tests.conftest import RedisServer
from tests.lambda_handlers import Endpoint


class Listener:
    """A TCP server that records every connection and the bytes it receives: where a
    function that leaked its Redis password would send it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    self.received.append(conn.recv(4096))
                except OSError:
                    self.received.append(b"")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


SPACES = {"obs_shape": [4], "obs_dtype": "float32", "action": {"kind": "discrete", "n": 2}}


def _event(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"run_id": "r", "request_id": "q", "version": 0, "seed": 1,
                             "steps": 8, "env": {"id": "CartPole-v1", "num_envs": 1},
                             "algo": {"algo": "ppo", "spaces": SPACES},
                             "transport": {"kind": "inline"}}
    event.update(changes)
    return event


def _post(ep: Endpoint, event: Any) -> dict[str, Any]:
    """The function error of a refused event (or the result of an accepted one)."""
    import urllib.request

    request = urllib.request.Request(
        f"{ep.url}/2015-03-31/functions/nitro-actor/invocations",
        data=json.dumps(event).encode(), method="POST",
        headers={"X-Amz-Invocation-Type": "RequestResponse"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        body = json.loads(reply.read())
        body["function_error"] = reply.headers.get("X-Amz-Function-Error")
        return body


def _refused(ep: Endpoint, event: Any, reason: str) -> str:
    before = ep.stats()["refused"].get(reason, 0)
    error = _post(ep, event)
    assert error["function_error"] == "Unhandled", error
    assert error["errorType"] == "EventRefused", error
    assert error["errorMessage"].startswith(f"{reason}: "), error
    assert ep.stats()["refused"][reason] == before + 1
    return str(error["errorMessage"])


def _endpoint(*args: str, env: dict[str, str] | None = None) -> Endpoint:
    # No torch preloaded: a refused event never reaches torch.
    return Endpoint("--concurrency", "1", "--preload", "", "--initializer", "",
                    "--timeout-s", "30", *args, env=env).start()


# -- item 1: the event never chooses where credentials go ----------------------------------------


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.close()


def test_a_password_is_never_sent_to_the_host_an_event_names(listener: Listener) -> None:
    ep = _endpoint(env={"NITRO_REDIS_PASSWORD": "s3cret-pw", "REDIS_URL": ""})
    try:
        event = _event(transport={"kind": "redis", "url": f"redis://127.0.0.1:{listener.port}/0"})
        message = _refused(ep, event, "transport_url")
        assert "REDIS_URL" in message and "s3cret-pw" not in message
    finally:
        ep.stop()
    assert listener.received == []  # never connected, so never sent AUTH


def test_with_redis_url_set_another_host_or_tls_from_the_event_is_refused(
        listener: Listener, redis_server: RedisServer) -> None:
    ep = _endpoint(env={"REDIS_URL": redis_server.url, "NITRO_REDIS_PASSWORD": "s3cret-pw"})
    try:
        elsewhere = f"redis://127.0.0.1:{listener.port}/0"
        _refused(ep, _event(transport={"kind": "redis", "url": elsewhere}), "transport_url")
        other_db = redis_server.url.rsplit("/", 1)[0] + "/5"
        _refused(ep, _event(transport={"kind": "redis", "url": other_db}), "transport_url")
        for tls in ({"ssl_cert_reqs": "none"}, {"ssl_ca_certs": "/tmp/evil-ca.pem"}):
            event = _event(transport={"kind": "redis", "url": redis_server.url, **tls})
            _refused(ep, event, "transport_tls")
    finally:
        ep.stop()
    assert listener.received == []


# -- item 6: the env spec cannot import code or ask for unbounded work ---------------------------


def test_an_env_module_outside_the_allow_list_is_never_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    ep = _endpoint(env={"NITRO_TEST_IMPORT_MARKER": str(marker)})
    try:
        _refused(ep, _event(env={"id": "tests.import_marker:NitroMarker-v0"}), "env_module")
        _refused(ep, _event(env={"id": "NitroMarker-v0", "imports": ["tests.import_marker"]}),
                 "env_module")
        _refused(ep, _event(env={"id": "NoSuchEnv-v0"}), "env_id")
    finally:
        ep.stop()
    assert not marker.exists()


def test_the_plan_allows_its_own_env_module(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    plan = tmp_path / "plan.toml"
    plan.write_text('[env]\nid = "tests.import_marker:NitroMarker-v0"\n')
    ep = _endpoint("--plan", str(plan), env={"NITRO_TEST_IMPORT_MARKER": str(marker)})
    try:
        # Past every env check: it fails only later, for want of attached weights.
        result = _post(ep, _event(env={"id": "tests.import_marker:NitroMarker-v0"}))
        assert result["errorType"] == "ValueError", result
        assert "were not attached" in result["errorMessage"]
        # Another module is still refused.
        _refused(ep, _event(env={"id": "CartPole-v1", "imports": ["os"]}), "env_module")
    finally:
        ep.stop()
    assert marker.exists()


@pytest.mark.parametrize(("changes", "words"), [
    ({"env": {"id": "CartPole-v1", "num_envs": 5000}}, "num_envs"),
    ({"env": {"id": "CartPole-v1", "num_envs": 4096}, "steps": 1_000_000}, "steps x num_envs"),
    ({"env": {"id": "CartPole-v1", "kwargs": {"pad": "x" * 20_000}}}, "kwargs"),
    ({"env": {"id": "CartPole-v1", "kwargs": {"a": [[[[[[[[[[1]]]]]]]]]]}}}, "kwargs"),
    ({"env": {"id": "CartPole-v1", "max_episode_steps": 10**12}}, "max_episode_steps"),
    ({"env": {"id": "CartPole-v1", "gamma": float("inf")}}, "gamma"),
    ({"algo": {"algo": "ppo", "spaces": SPACES, "net": {"hidden_sizes": [100_000]}}},
     "hidden_sizes"),
    ({"algo": {"algo": "ppo", "spaces": SPACES, "net": {"hidden_sizes": [64] * 100}}},
     "hidden_sizes"),
    ({"algo": {"algo": "ppo", "net": {"hidden_sizes": [8192] * 16},
               "spaces": {**SPACES, "obs_shape": [4096]}}}, "parameters"),
    ({"algo": {"algo": "ppo", "spaces": {**SPACES, "obs_shape": [1 << 30]}}}, "obs_shape"),
    ({"algo": {"algo": "ppo", "spaces": {**SPACES, "action": {"kind": "box",
                                                               "shape": [1 << 20]}}}},
     "action space"),
])
def test_sizes_past_the_bounds_are_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(actor_function.EventRefused) as info:
        actor_function.validate_event(_event(**changes))
    assert info.value.reason == "bounds" and words in str(info.value)


def test_what_a_validated_plan_produces_passes() -> None:
    event = _event(env={"id": "CartPole-v1", "num_envs": 8, "kwargs": {}, "gamma": 0.99,
                        "clip_obs": 10.0, "normalize_obs": True, "normalize_reward": True,
                        "clip_reward": None, "max_episode_steps": None, "imports": []},
                   algo={"algo": "ppo", "spaces": {"obs_shape": [4], "obs_dtype": "float32",
                                                   "action": {"kind": "discrete", "n": 2}},
                         "net": {"hidden_sizes": [64, 64], "activation": "tanh"}},
                   steps=128)
    assert actor_function.validate_event(event) is event


# -- item 12: warm caches keyed by run id are bounded and close what they evict ------------------


def test_warm_caches_close_what_they_evict() -> None:
    from envs import Sampler

    cache = actor_function._Lru(2, actor_function._close)
    samplers = [Sampler({"id": "CartPole-v1", "num_envs": 1}, seed=i) for i in range(3)]
    for run, sampler in enumerate(samplers):
        cache.put(f"run-{run}", sampler)
    assert len(cache) == 2 and cache.get("run-0") is None
    assert samplers[0].envs.closed  # the evicted run's envs are closed, not leaked
    assert not samplers[1].envs.closed and not samplers[2].envs.closed
    cache.get("run-1")  # used last: run-2 is now the oldest
    cache.put("run-3", Sampler({"id": "CartPole-v1", "num_envs": 1}, seed=3))
    assert samplers[2].envs.closed and cache.get("run-1") is samplers[1]
