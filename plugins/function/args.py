"""The arguments of ``nitro lambda serve``, apart from the endpoint so that listing them (the
CLI's ``--help``) imports no aiohttp, and the CLI and the endpoint import neither each other."""

from __future__ import annotations

import argparse
import os


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (loopback only unless --allow-remote)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a non-loopback --host: the endpoint checks no signatures")
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--function", default="nitro-actor", help="function name served")
    # dest differs from "handler": set_defaults(handler=...) names the sub-command's function.
    parser.add_argument("--handler", dest="function_handler",
                        default="plugins.function.handler:handler", help="module:function to run")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 2,
                        help="reserved concurrency: warm workers; more sync calls get 429")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="function timeout")
    parser.add_argument("--memory-mb", type=int, default=1769, help="reported memory size")
    parser.add_argument("--retry-after-s", type=float, default=1.0,
                        help="Retry-After sent with a throttle")
    parser.add_argument("--preload", default=None,
                        help="comma-separated modules the forkserver imports once")
    parser.add_argument("--initializer", default=None, help="module:function run per worker")
    parser.add_argument("--max-queued-events", type=int, default=256,
                        help="Event invocations queued or running at once; more get 429")
    parser.add_argument("--max-queued-mb", type=float, default=64.0,
                        help="bodies of queued Event invocations, in MiB; more get 429")
    parser.add_argument("--plan", default=None,
                        help="the learner's plan: its env.id module and env.imports become the "
                             "modules an event may import (NITRO_ENV_MODULES)")
    parser.add_argument("--env-modules", default=None,
                        help="comma-separated modules an event's env may import")
