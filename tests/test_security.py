"""Secrets stay secret and channels can be encrypted.

- A Redis password given in the URL never reaches any file of the run directory (plan, events,
  logs, summary, checkpoints, CSV, TensorBoard), the terminal, the values Nitro stores in
  Redis, or the events the Lambda function receives (functions get it from their environment).
- ``rediss://`` works end to end against a TLS-only redis-server with a self-signed CA, and
  certificate verification is really on (without the CA the run cannot connect).

tests/test_redis_run.py covers the basic password-in-URL and password-from-environment runs;
this file adds checkpoints, every sink, debug logs, Redis contents, the Lambda path and TLS.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import ROOT, RedisServer, missing, run_cli

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
PASSWORD = "nitro-s3cret-Q7zx"
#: Every observer on, debug logs, a checkpoint each round: as many places to leak as possible.
NOISY = ["--set", "run.log_level=debug", "--set", "checkpoint.every=1",
         "--set", "checkpoint.keep=5", "--set", "actors.steps=32", "--set", "probes=[]",
         "--set", "sinks=[{name='console', progress='plain'}, {name='csv'}, "
                  "{name='tensorboard'}, {name='jsonl', events=['*']}]"]
RECORD_ENV = "NITRO_TEST_RECORD_EVENTS"


def recording_handler(event: Any, context: Any) -> Any:
    """The real actor function, after appending the raw event it received to a file (for the
    Lambda test: what crosses the Invoke API must not hold a secret)."""
    from plugins.function.handler import handler

    with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event) + "\n")
    return handler(event, context)


def assert_no_secret(run_dir: Path, *texts: str, expect: set[str] | None = None) -> list[Path]:
    """No file under ``run_dir`` and none of ``texts`` holds the password; returns the files."""
    for text in texts:
        assert PASSWORD not in text
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"plan.toml", "summary.json", "events.jsonl", "log.jsonl"} <= names, names
    for path in files:
        data = path.read_bytes()
        assert PASSWORD.encode() not in data, path
        assert PASSWORD.encode("utf-16-le") not in data, path
    missing = {n for n in (expect or set()) if not any(p.match(n) for p in files)}
    assert not missing, (missing, sorted(names))
    return files


class RedisRecorder:
    """Every command the server executes while the run lives (Redis MONITOR, which hides AUTH
    arguments), so values written and deleted again are checked too."""

    def __init__(self, url: str, **ssl: Any):
        import redis

        # No read timeout (redis-py 8 defaults to 5 s): a run starts slowly, and a timed-out
        # read would drop the MONITOR connection.
        self.client = redis.Redis.from_url(url, socket_timeout=None, **ssl)
        self.commands: list[str] = []
        self._stopping = False
        self._monitor = self.client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        # Raw MONITOR lines (``<time> [db addr] "SET" "key" "value"``): redis-py's parser of
        # them trips over some binary values, and every byte is what we want to see.
        connection = self._monitor.connection
        while not self._stopping:
            try:
                line = connection.read_response()
            except Exception:  # the connection closes when the test stops recording
                return
            self.commands.append(line.decode("utf-8", "replace")
                                 if isinstance(line, bytes) else str(line))

    def stop(self) -> list[str]:
        self._stopping = True
        self._monitor.connection.disconnect()
        self._thread.join(timeout=10)
        return self.commands


def assert_redis_clean(recorder: RedisRecorder) -> None:
    """Nothing Nitro wrote to Redis (weights, batches) held the password, and the clean end
    left no key of the run behind."""
    commands = recorder.stop()
    written = [c for c in commands if '"SET"' in c.upper() or '"XADD"' in c.upper()]
    assert written, "the run stored nothing in Redis?"
    for command in commands:
        assert PASSWORD not in command, command[:200]
    assert recorder.client.keys("nitro:*") == []
    recorder.client.close()


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, password=PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.redis
def test_password_reaches_no_run_file_checkpoint_sink_or_redis_value(
        password_redis: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    recorder = RedisRecorder(password_redis.url)
    proc = run_cli("run", CARTPOLE, "--out", str(out), "--set", "transport.kind=redis",
                   "--set", f"transport.url={password_redis.url}", "--set", "stop.max_rounds=3",
                   "--set", "actors.count=2", *NOISY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["invocation_errors"] == 0
    files = assert_no_secret(out, proc.stdout, proc.stderr,
                             expect={"ckpt-*.nitro", "rounds.csv", "events.out.tfevents*",
                                     "rounds.jsonl"})
    assert sum(p.suffix == ".nitro" for p in files) == 3
    assert "redis://:***@127.0.0.1" in (out / "plan.toml").read_text()
    # Debug logs did log the (redacted) URL: the redaction, not silence, keeps it out.
    assert "127.0.0.1" in (out / "log.jsonl").read_text()
    assert_redis_clean(recorder)


@pytest.mark.redis
def test_resume_takes_the_password_from_the_environment(
        password_redis: RedisServer, tmp_path: Path) -> None:
    """The run directory holds no password, so a resumed run must get it from the env."""
    out = tmp_path / "run"
    proc = run_cli("run", CARTPOLE, "--out", str(out), "--set", "transport.kind=redis",
                   "--set", f"transport.url={password_redis.url}", "--set", "stop.max_rounds=1",
                   *NOISY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("run", "--resume", str(out), "--set", "stop.max_rounds=2",
                   env={"NITRO_REDIS_PASSWORD": PASSWORD}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2
    assert_no_secret(out, proc.stdout, proc.stderr)


@pytest.mark.redis
def test_lambda_events_carry_no_secret(password_redis: RedisServer, tmp_path: Path) -> None:
    from plugins.actors.local import PRELOAD
    from tests.lambda_handlers import Endpoint

    record = tmp_path / "events.jsonl"
    ep = Endpoint("--handler", "tests.test_security:recording_handler",
                  "--preload", ",".join(PRELOAD),
                  "--initializer", "plugins.function.handler:init_worker",
                  "--concurrency", "2", "--timeout-s", "60",
                  env={"REDIS_URL": password_redis.url, RECORD_ENV: str(record)})
    ep.start(timeout=120)
    try:
        out = tmp_path / "run"
        proc = run_cli("run", CARTPOLE, "--out", str(out), "--set", "actors.backend=lambda",
                       "--set", f"actors.endpoint_url={ep.url}", "--set", "actors.count=2",
                       "--set", "actors.concurrency=2", "--set", "actors.deadline_s=60",
                       "--set", "transport.kind=redis",
                       "--set", f"transport.url={password_redis.url}",
                       "--set", "stop.max_rounds=2", *NOISY)
    finally:
        ep.stop()
    assert proc.returncode == 0, proc.stderr[-3000:] + ep.log()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["invocation_errors"] == 0
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(events) == summary["invocations"] == 4
    assert PASSWORD not in record.read_text()
    for event in events:
        assert event["transport"]["url"] == f"redis://127.0.0.1:{password_redis.port}/0"
    assert_no_secret(out, proc.stdout, proc.stderr, ep.log())


# -- TLS -------------------------------------------------------------------------------------

@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[Any]:
    from tests.tls_certs import TlsRedisServer, TlsUnsupported, make_certs

    try:
        certs = make_certs(tmp_path / "certs")
    except (FileNotFoundError, OSError) as exc:
        missing(f"cannot make certificates with openssl: {exc}")
    server = TlsRedisServer(tmp_path, certs, password=PASSWORD)
    try:
        server.start()
    except TlsUnsupported as exc:
        missing(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.redis
def test_rediss_run_with_a_self_signed_ca(tls_redis: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    recorder = RedisRecorder(tls_redis.url, ssl_ca_certs=str(tls_redis.certs.ca))
    proc = run_cli("run", CARTPOLE, "--out", str(out), "--set", "transport.kind=redis",
                   "--set", f"transport.url={tls_redis.url}",
                   "--set", f"transport.ssl_ca_certs={tls_redis.certs.ca}",
                   "--set", "transport.ssl_cert_reqs=required",
                   "--set", "stop.max_rounds=2", "--set", "actors.count=2", *NOISY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["invocation_errors"] == 0
    assert summary["env_steps"] == 2 * 2 * 32 * 4
    assert "rediss://:***@127.0.0.1" in (out / "plan.toml").read_text()
    assert_no_secret(out, proc.stdout, proc.stderr)
    assert_redis_clean(recorder)


@pytest.mark.redis
def test_rediss_refuses_a_server_it_cannot_verify(tls_redis: Any, tmp_path: Path) -> None:
    """Without the CA the learner cannot verify the server: the run fails and says why (no
    silent fallback to an unverified or plain-text connection)."""
    out = tmp_path / "run"
    proc = run_cli("run", CARTPOLE, "--out", str(out), "--set", "transport.kind=redis",
                   "--set", f"transport.url={tls_redis.url}",
                   "--set", "transport.reconnect_s=1", "--set", "stop.max_rounds=1",
                   *NOISY, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "TLS certificate verification failed" in proc.stderr, proc.stderr[-2000:]
    assert "transport.ssl_ca_certs" in proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr


@pytest.mark.redis
def test_an_event_cannot_turn_tls_checks_off_in_the_function(
        tls_redis: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The function's TLS policy is its environment's: an event saying ``ssl_cert_reqs =
    "none"`` does not make it talk to a server it cannot verify."""
    from plugins.transports.redis_stream import PASSWORD_ENV, TLS_ENV, URL_ENV, ActorRedisClient

    public = f"rediss://127.0.0.1:{tls_redis.port}/0"
    monkeypatch.setenv(URL_ENV, public)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    for name in TLS_ENV.values():
        monkeypatch.delenv(name, raising=False)
    event = {"kind": "redis", "url": public, "ssl_cert_reqs": "none"}
    actor = ActorRedisClient.from_spec(event)
    actor.attempts = 1
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        actor.push_batch("r-tls", b"x")
    actor.close()
    monkeypatch.setenv(TLS_ENV["ssl_ca_certs"], str(tls_redis.certs.ca))
    actor = ActorRedisClient.from_spec(event)
    actor.push_batch("r-tls", b"x")  # verified against the CA the environment names
    actor.close()


@pytest.mark.redis
@pytest.mark.parametrize("form", ["unencoded_at", "query"])
def test_every_url_form_of_the_password_stays_out_of_the_run(tmp_path: Path, form: str) -> None:
    """A password with an unencoded '@' in the user info, or in a ``?password=`` argument:
    the run connects with it, and plan.toml, logs, events and the terminal never hold it."""
    password = "nitro@s3cret-Q7zx"
    server = RedisServer(tmp_path, password=password)
    server.start()
    try:
        host = f"127.0.0.1:{server.port}"
        url = {"unencoded_at": f"redis://:{password}@{host}/0",
               "query": f"redis://{host}/0?password={password}"}[form]
        out = tmp_path / "run"
        proc = run_cli("run", CARTPOLE, "--out", str(out), "--set", "transport.kind=redis",
                       "--set", f"transport.url={url}", "--set", "stop.max_rounds=1",
                       "--set", "actors.steps=32", "--set", "run.log_level=debug",
                       "--set", "probes=[]", "--set", "sinks=[{name='jsonl', events=['*']}]")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((out / "summary.json").read_text())["invocation_errors"] == 0
        for secret in (password, "s3cret-Q7zx"):  # nor its tail after the '@'
            assert secret not in proc.stdout + proc.stderr
            for path in (p for p in out.rglob("*") if p.is_file()):
                assert secret.encode() not in path.read_bytes(), path
        plan = (out / "plan.toml").read_text()
        assert {"unencoded_at": f"redis://:***@{host}/0",
                "query": f"redis://{host}/0?password=***"}[form] in plan
    finally:
        server.stop()
