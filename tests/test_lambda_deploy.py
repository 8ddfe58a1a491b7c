"""``lambda deploy`` against moto's server mode (AWS itself is the one thing we mock)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from plugins.function.cli import register
from plugins.function.deploy import DeploySpec, deploy, parse_env

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/nitro-actor"
TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    pytest.importorskip("flask", reason="moto's server mode needs flask (moto[server])")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Fake credentials for the standard chain, and an execution role (moto checks it)."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    iam = boto3.client("iam", endpoint_url=moto_url, region_name="us-east-1")
    name = f"nitro-actor-{id(monkeypatch)}"
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(TRUST))
    lam = boto3.client("lambda", endpoint_url=moto_url, region_name="us-east-1")
    return {"url": moto_url, "role": role["Role"]["Arn"], "lambda": lam}


def test_create_then_update(aws: dict[str, Any]) -> None:
    spec = DeploySpec(image_uri=f"{IMAGE}:1", role=aws["role"], function="actor-a",
                      endpoint_url=aws["url"], env={"REDIS_URL": "rediss://cache:6379/0"},
                      memory_mb=2048, timeout_s=120)
    created = asyncio.run(deploy(spec))
    assert created["PackageType"] == "Image" and created["MemorySize"] == 2048
    assert created["Timeout"] == 120
    assert aws["lambda"].get_function(FunctionName="actor-a")["Code"]["ImageUri"] == f"{IMAGE}:1"

    spec.image_uri, spec.memory_mb, spec.reserved_concurrency = f"{IMAGE}:2", 3008, 25
    spec.env["NITRO_REDIS_PASSWORD"] = "s3cret"
    updated = asyncio.run(deploy(spec))
    assert updated["FunctionArn"] == created["FunctionArn"]  # updated in place, not recreated
    assert updated["MemorySize"] == 3008
    assert updated["ReservedConcurrentExecutions"] == 25
    assert updated["Environment"]["Variables"]["NITRO_REDIS_PASSWORD"] == "s3cret"
    assert aws["lambda"].get_function(FunctionName="actor-a")["Code"]["ImageUri"] == f"{IMAGE}:2"


def test_cli_deploy(aws: dict[str, Any], capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the kernel's CLI, with ``register`` as the nitro.commands entry point gives it."""
    from kernel import cli

    monkeypatch.setattr(cli, "_extra_commands", lambda: [register])
    code = cli.main([
        "lambda", "deploy", "--image-uri", f"{IMAGE}:7", "--role", aws["role"],
        "--function", "actor-cli", "--memory-mb", "1024", "--timeout-s", "60",
        "--env", "REDIS_URL=redis://10.0.0.5:6379/0", "--env", "NITRO_REDIS_PASSWORD=hunter2",
        "--reserved-concurrency", "5", "--endpoint-url", aws["url"],
    ])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["FunctionName"] == "actor-cli" and out["MemorySize"] == 1024
    assert out["ReservedConcurrentExecutions"] == 5
    assert out["EnvironmentKeys"] == ["NITRO_REDIS_PASSWORD", "REDIS_URL"]
    assert "hunter2" not in json.dumps(out)  # values never printed


def test_cli_help_lists_serve_and_deploy() -> None:
    parser = argparse.ArgumentParser(prog="nitro")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["lambda", "serve", "--port", "9100", "--concurrency", "3"])
    assert (args.port, args.concurrency, args.handler.__name__) == (9100, 3, "_serve")
    assert args.handler.__module__ == "plugins.function.cli"


def test_bad_arguments_fail_before_any_call() -> None:
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_env(["NOEQUALS"])
    spec = DeploySpec(image_uri="x", role="r", timeout_s=901)
    with pytest.raises(ValueError, match="timeout"):
        asyncio.run(deploy(spec))
