"""``python -m kernel`` / ``nitro``: run, validate and list.

Exit codes: 0 done, 1 a plugin failed (named on stderr) or the run trained nothing or stopped
because its actors kept failing, 2 a bad plan, bad arguments, an unreachable platform or a run
directory that refuses the run (one message, never a traceback), 130 stopped by a signal
(SIGINT or SIGTERM; the summary is written, during start-up too).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernel import logs
from kernel.registry import PluginError, default_registry
from kernel.schema import PlanError

EXIT_OK, EXIT_FAILED, EXIT_BAD_PLAN = 0, 1, 2


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, when it has one worth saying, so ``--help``
    answers "what happens if I leave this out" without a look at the code."""

    def add_argument(self, action: argparse.Action) -> None:
        if action.help is None and _shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        super().add_argument(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "%(default)" in text or "default" in text or not _shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    return (bool(action.option_strings) and default not in (None, False, [], "")
            and default is not argparse.SUPPRESS and action.nargs != 0)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # argparse's default is also 2; keep one line
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_BAD_PLAN)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="nitro", description="Nitro: boosted serverless deep RL.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="train from a plan")
    run.add_argument("plan", nargs="?", help="plan.toml (omit with --resume)")
    run.add_argument("--out", help="run directory, new or empty (default "
                     "runs/<name>-<timestamp>)")
    run.add_argument("--force", action="store_true",
                     help="start a new run in a non-empty --out, deleting the checkpoints, "
                          "journal and summary of the run found there")
    run.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="KEY.PATH=VALUE", help="override a plan key with a TOML value")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")

    validate = sub.add_parser("validate", help="check a plan and print it resolved")
    validate.add_argument("plan")
    validate.add_argument("--set", dest="overrides", action="append", default=[],
                          metavar="KEY.PATH=VALUE")

    plugins = sub.add_parser("plugins", help="list plugins with kind, doc and configuration keys")
    plugins.add_argument("--markdown", action="store_true",
                         help="print the plan reference (docs/plan.md) instead")

    for extra in _extra_commands():
        extra(sub)
    return parser


def _extra_commands() -> list[Any]:
    """Sub-commands that plugins add through the ``nitro.commands`` entry-point group (lambda
    serve/deploy, report): each entry point is ``register(subparsers)``."""
    from importlib.metadata import entry_points

    commands = []
    for ep in entry_points(group="nitro.commands"):
        try:
            commands.append(ep.load())
        except ImportError as exc:
            sys.stderr.write(f"nitro: command {ep.name!r} unavailable: {exc}\n")
    return commands


def version() -> str:
    """The installed distribution's version (a source tree that was never installed says so)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("nitro-rl")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure("info")
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "validate":
            return _validate(args)
        if args.command == "plugins":
            return _plugins(args.markdown)
        return int(args.handler(args))
    except PlanError as exc:
        sys.stderr.write(f"nitro: bad plan: {exc}\n")
        return EXIT_BAD_PLAN
    except PluginError as exc:
        sys.stderr.write(f"nitro: {exc}\n")
        return EXIT_BAD_PLAN
    except KeyboardInterrupt:  # Ctrl-C before the run's own handlers (reading the plan)
        sys.stderr.write("nitro: interrupted\n")
        return 130


def _validate(args: argparse.Namespace) -> int:
    import tomli_w

    from kernel.jsonsafe import drop_none as _drop_none
    from kernel.plan import load_plan

    plan = load_plan(args.plan, args.overrides)
    sys.stdout.write(tomli_w.dumps(_drop_none(logs.redact(plan))))
    sys.stderr.write(f"{args.plan}: ok\n")
    return EXIT_OK


def _plugins(markdown: bool = False) -> int:
    registry = default_registry()
    if markdown:
        from kernel.plandoc import render

        sys.stdout.write(render(registry))
        return EXIT_OK
    for plugin in registry.all():
        sys.stdout.write(f"{plugin.kind:<10} {plugin.name:<12} {plugin.doc}"
                         f"{'' if plugin.source == 'nitro-rl' else f'  [{plugin.source}]'}\n")
        for key, field in plugin.config.items():
            default = "required" if field.required else f"default {field.default!r}"
            sys.stdout.write(f"{'':<24}{key} ({field.expectation()}; {default})"
                             f"{': ' + field.doc if field.doc else ''}\n")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from kernel.engine import Engine
    from kernel.plan import load_plan

    if args.resume:
        # The run's own plan.toml is the plan; a second one (or a second directory) would be
        # silently ignored or mixed into a run it does not belong to.
        for given, what in ((args.plan, "a plan file"), (args.out, "--out"),
                            (args.force or None, "--force")):
            if given is not None:
                raise PlanError("--resume", f"RUN_DIR without {what}", given,
                                note="a run continues in its own directory from its own "
                                     "plan.toml; change keys with --set")
        engine = Engine.resume(Path(args.resume), args.overrides)
    else:
        if not args.plan:
            raise PlanError("plan", "a plan file (or --resume RUN_DIR)")
        plan = load_plan(args.plan, args.overrides)
        engine = Engine(plan, out_dir=args.out, force=args.force)
    logs.configure(engine.plan["run"]["log_level"])
    return asyncio.run(_serve(engine))


async def _serve(engine: Any) -> int:
    from kernel.contract import PluginContractError, PluginCrashed
    from kernel.roles import Unreachable

    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    main_task = asyncio.current_task()

    started = False

    def on_signal(sig: signal.Signals) -> None:
        # A second signal stops now; so does the first while plugins start or a preflight
        # waits (nothing would look at the stop request before round 1). The summary is
        # written either way.
        again = engine.stop_requested.is_set()
        engine.request_stop(f"signal {sig.name}")
        if (again or not started) and main_task is not None:
            main_task.cancel()

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        async with engine:
            started = True
            summary = await engine.run()
    except (Unreachable, PluginContractError) as exc:
        sys.stderr.write(f"nitro: {exc}\n")
        return EXIT_BAD_PLAN
    except PluginCrashed as exc:
        sys.stderr.write(f"nitro: {exc}\n")
        return EXIT_FAILED
    except asyncio.CancelledError:
        return 130
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    return exit_status(summary)


def exit_status(summary: dict[str, Any]) -> int:
    """Non-zero when the run failed, trained nothing, or ended because its actors kept
    failing, so `nitro run ... && next` does not go on after a run that did no work; 130
    when a signal stopped it (as a shell reports an interrupted command)."""
    reason = str(summary.get("stop_reason", ""))
    if reason.startswith("signal"):
        return 130
    if reason.startswith("error") or reason == "actors_failing" or \
            not summary.get("env_steps"):
        return EXIT_FAILED
    return EXIT_OK
