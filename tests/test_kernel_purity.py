"""The kernel stays small and knows no RL library; nothing on the data plane unpickles."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_kernel_imports_no_torch_gymnasium_or_mujoco() -> None:
    code = (
        "import importlib, pkgutil, sys, kernel\n"
        "for m in pkgutil.walk_packages(kernel.__path__, 'kernel.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "bad = [x for x in ('torch', 'gymnasium', 'mujoco', 'ale_py', 'envs', 'algos', 'plugins')"
        " if x in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_no_pickle_or_eval_in_the_packages() -> None:
    pattern = re.compile(
        r"^\s*(import (c?pickle|dill|cloudpickle|marshal|shelve)\b|from (c?pickle|dill|"
        r"cloudpickle|marshal|shelve) import)|\bpickle\.loads?\(|(?<![.\w])(eval|exec)\(",
        re.M,
    )
    hits = []
    for package in ("kernel", "plugins", "algos", "envs"):
        for path in (ROOT / package).rglob("*.py"):
            for match in pattern.finditer(path.read_text(encoding="utf-8")):
                hits.append(f"{path.relative_to(ROOT)}: {match.group(0).strip()}")
    assert hits == []


def test_every_kernel_module_reads_on_a_few_screens() -> None:
    """The kernel stays small: a module past 400 lines is doing more than one job."""
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "kernel").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}, f"kernel modules over 400 lines (split them): {long}"
