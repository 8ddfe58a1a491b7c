"""Create or update the actor function on AWS Lambda from a container image.

``python -m kernel lambda deploy --image-uri URI --role ARN`` is idempotent: the first call
creates the function (``PackageType=Image``), later calls push a new image and configuration.
Lambda refuses a configuration update while a code update is still in progress
(``ResourceConflictException``), so each step waits for ``LastUpdateStatus`` to settle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import ClientError

from plugins.actors.aws_lambda import resolve_region

log = structlog.get_logger("plugins.function.deploy")


@dataclass
class DeploySpec:
    image_uri: str
    role: str
    function: str = "nitro-actor"
    #: None: the AWS configuration's Region (AWS_REGION, the profile), else us-east-1.
    region: str | None = None
    memory_mb: int = 1769
    timeout_s: int = 300
    architecture: str = "x86_64"
    env: dict[str, str] = field(default_factory=dict)
    reserved_concurrency: int | None = None
    endpoint_url: str | None = None
    #: How long to wait for a pending create/update to settle.
    settle_s: float = 300.0

    def check(self) -> None:
        if not 128 <= self.memory_mb <= 10240:
            raise ValueError(f"--memory-mb must be in 128..10240, got {self.memory_mb}")
        if not 1 <= self.timeout_s <= 900:
            raise ValueError(f"--timeout-s must be in 1..900, got {self.timeout_s}")
        if self.architecture not in ("x86_64", "arm64"):
            raise ValueError(f"--architecture must be x86_64 or arm64, got {self.architecture}")
        if self.reserved_concurrency is not None and self.reserved_concurrency < 0:
            raise ValueError("--reserved-concurrency must be >= 0")


async def deploy(spec: DeploySpec) -> dict[str, Any]:
    """Create or update the function; return its final configuration (as Lambda reports it)."""
    spec.check()
    session = get_session()
    region = resolve_region(session, spec.region)
    config = Config(region_name=region, retries={"total_max_attempts": 5, "mode": "standard"})
    kwargs: dict[str, Any] = {"region_name": region, "config": config}
    if spec.endpoint_url:
        kwargs["endpoint_url"] = spec.endpoint_url
    settings = {
        "Role": spec.role,
        "MemorySize": spec.memory_mb,
        "Timeout": spec.timeout_s,
        "Environment": {"Variables": dict(spec.env)},
        "Description": "Nitro actor function (plugins.function.handler.handler)",
    }
    async with session.create_client("lambda", **kwargs) as client:
        try:
            await client.get_function(FunctionName=spec.function)
            exists = True
        except client.exceptions.ResourceNotFoundException:
            exists = False
        if not exists:
            result = await client.create_function(
                FunctionName=spec.function, PackageType="Image",
                Code={"ImageUri": spec.image_uri}, Architectures=[spec.architecture],
                Publish=False, **settings,
            )
            log.info("function_created", function=spec.function, arn=result["FunctionArn"])
            await _settle(client, spec)
        else:
            await client.update_function_code(FunctionName=spec.function,
                                              ImageUri=spec.image_uri,
                                              Architectures=[spec.architecture])
            await _settle(client, spec)
            await client.update_function_configuration(FunctionName=spec.function, **settings)
            log.info("function_updated", function=spec.function, image=spec.image_uri)
            await _settle(client, spec)
        if spec.reserved_concurrency is not None:
            await client.put_function_concurrency(
                FunctionName=spec.function,
                ReservedConcurrentExecutions=spec.reserved_concurrency)
        final = await client.get_function_configuration(FunctionName=spec.function)
        final.pop("ResponseMetadata", None)
        try:
            reserved = await client.get_function_concurrency(FunctionName=spec.function)
            final["ReservedConcurrentExecutions"] = reserved.get("ReservedConcurrentExecutions")
        except ClientError:
            pass
        return final


async def _settle(client: Any, spec: DeploySpec) -> None:
    """Wait while the function is Pending or an update is InProgress."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spec.settle_s
    delay = 0.5
    while True:
        conf = await client.get_function_configuration(FunctionName=spec.function)
        state, update = conf.get("State"), conf.get("LastUpdateStatus")
        if state == "Failed" or update == "Failed":
            reason = conf.get("LastUpdateStatusReason") or conf.get("StateReason") or "unknown"
            raise RuntimeError(f"function {spec.function} failed to deploy: {reason}")
        if state != "Pending" and update != "InProgress":
            return
        if loop.time() >= deadline:
            raise TimeoutError(f"function {spec.function} still {state}/{update} after "
                               f"{spec.settle_s:.0f}s")
        await asyncio.sleep(delay)
        delay = min(5.0, delay * 2)


def parse_env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env expects KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def spec_from_args(args: argparse.Namespace) -> DeploySpec:
    return DeploySpec(
        image_uri=args.image_uri, role=args.role, function=args.function, region=args.region,
        memory_mb=args.memory_mb, timeout_s=args.timeout_s, architecture=args.architecture,
        env=parse_env(args.env), reserved_concurrency=args.reserved_concurrency,
        endpoint_url=args.endpoint_url,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """CLI body: prints the resulting configuration as JSON, secrets in env redacted."""
    from kernel import logs

    logs.configure("info")  # logs to stderr: stdout carries only the JSON result
    try:
        spec = spec_from_args(args)
        result = asyncio.run(deploy(spec))
    except ValueError as exc:
        sys.stderr.write(f"nitro lambda deploy: {exc}\n")
        return 2
    except (ClientError, RuntimeError, TimeoutError) as exc:
        sys.stderr.write(f"nitro lambda deploy: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(_summary(logs.redact(result)), indent=2, default=str) + "\n")
    return 0


def _summary(conf: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("FunctionName", "FunctionArn", "PackageType", "MemorySize", "Timeout",
            "Architectures", "State", "LastUpdateStatus", "ReservedConcurrentExecutions")
    out = {k: conf.get(k) for k in keys if k in conf}
    variables = conf.get("Environment", {}).get("Variables", {})
    out["EnvironmentKeys"] = sorted(variables)  # names only: values may be secrets
    return out
