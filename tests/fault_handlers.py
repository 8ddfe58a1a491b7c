"""Actor handlers that misbehave on purpose, for the fault tests.

``faulty`` wraps the real handler. What goes wrong, for which actors and rounds, comes from the
``NITRO_FAULT`` environment variable (JSON), which worker processes inherit:
``{"mode": "raise" | "hang" | "crash" | "slow", "actors": [0], "rounds": [2], "seconds": 5,
"once_file": "/tmp/x", "pid_file": "/tmp/p"}``. With ``once_file`` the fault happens only until
that file exists; ``pid_file`` receives the faulty worker's process id.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from plugins.function.handler import handler

_ID = re.compile(r"-r(?P<round>\d+)-v\d+-a(?P<actor>\d+)$")


def _should_fail(event: dict[str, Any], fault: dict[str, Any]) -> bool:
    match = _ID.search(event["request_id"])
    if match is None:
        return False
    if "actors" in fault and int(match["actor"]) not in fault["actors"]:
        return False
    if "rounds" in fault and int(match["round"]) not in fault["rounds"]:
        return False
    once = fault.get("once_file")
    if once:
        if Path(once).exists():
            return False
        Path(once).write_text("done")
    return True


def faulty(event: dict[str, Any], context: Any) -> dict[str, Any]:
    fault = json.loads(os.environ.get("NITRO_FAULT", "{}"))
    if fault and _should_fail(event, fault):
        mode = fault["mode"]
        if fault.get("pid_file"):
            Path(fault["pid_file"]).write_text(str(os.getpid()))
        if mode == "raise":
            raise RuntimeError("injected handler failure")
        if mode == "hang":
            while True:
                time.sleep(1)
        if mode == "crash":
            os._exit(17)
        if mode == "slow":
            time.sleep(float(fault.get("seconds", 5)))
    return handler(event, context)
