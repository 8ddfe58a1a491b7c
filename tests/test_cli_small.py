"""The command line's small courtesies: --version, defaults in --help."""

from __future__ import annotations

import pytest

from kernel import cli


def _exit_output(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 0
    return capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert _exit_output(["--version"], capsys).strip() == f"nitro {version('nitro-rl')}"


def test_help_shows_defaults_of_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Options without a help text of their own (plugins' commands) show their default too."""
    serve = " ".join(_exit_output(["lambda", "serve", "--help"], capsys).split())
    assert "--port PORT (default: 9001)" in serve
    assert "(default: 127.0.0.1)" in serve
    run = " ".join(_exit_output(["run", "--help"], capsys).split())
    assert "(default: None)" not in run and "(default: [])" not in run
