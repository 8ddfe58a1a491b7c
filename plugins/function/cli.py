"""``python -m kernel lambda serve|deploy``: registered through the ``nitro.commands`` entry
point (``lambda = "plugins.function.cli:register"``). The heavy modules (aiohttp, aiobotocore)
are imported only when a sub-command runs, so ``python -m kernel --help`` stays fast."""

from __future__ import annotations

import argparse
from typing import Any

from plugins.function.args import add_serve_arguments


def register(sub: Any) -> None:
    """Add ``lambda`` with its ``serve`` and ``deploy`` sub-commands to the kernel's CLI."""
    parser = sub.add_parser("lambda", help="AWS Lambda: local endpoint, deployment")
    commands = parser.add_subparsers(dest="lambda_command", required=True,
                                     parser_class=type(parser))
    serve = commands.add_parser(
        "serve", help="a local endpoint speaking Lambda's Invoke API (warm worker processes)")
    add_serve_arguments(serve)
    serve.set_defaults(handler=_serve)
    deploy = commands.add_parser(
        "deploy", help="create or update the actor function from a container image")
    add_deploy_arguments(deploy)
    deploy.set_defaults(handler=_deploy)


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image-uri", required=True, help="ECR image URI (repo:tag or @digest)")
    parser.add_argument("--role", required=True, help="execution role ARN of the function")
    parser.add_argument("--function", default="nitro-actor")
    parser.add_argument("--region", default=None,
                        help="AWS Region (default: AWS_REGION or the profile's, else us-east-1)")
    parser.add_argument("--memory-mb", type=int, default=1769)
    parser.add_argument("--timeout-s", type=int, default=300)
    parser.add_argument("--architecture", default="x86_64", choices=("x86_64", "arm64"))
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                        help="function environment variable (repeatable), e.g. REDIS_URL=...")
    parser.add_argument("--reserved-concurrency", type=int, default=None)
    parser.add_argument("--endpoint-url", default=None, help="Lambda API endpoint (tests)")


def _serve(args: argparse.Namespace) -> int:
    from plugins.function.endpoint import run_from_args

    return run_from_args(args)


def _deploy(args: argparse.Namespace) -> int:
    from plugins.function.deploy import run_from_args

    return run_from_args(args)
