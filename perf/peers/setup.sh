#!/usr/bin/env bash
# Creates one virtual environment per peer library, each pinned, never touching the project's
# .venv. Idempotent: a venv whose stamp matches its constraints file is left as it is.
# Usage: perf/peers/setup.sh [sb3|rllib ...]   (default: all)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(sb3 rllib)

install_peer() {
    local name="$1"; shift
    local venv="$HERE/.venv-$name" cons="$HERE/constraints-$name.txt"
    local stamp="$venv/.installed"
    # The stamp records what was installed: the constraints and the requirements.
    local want; want="$(cat "$cons"; echo "requirements: $*")"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        echo "[$name] up to date: $venv"; return 0
    fi
    echo "[$name] installing into $venv"
    # `set -e` does not apply inside a function called from `||`: check each step by hand.
    rm -f "$stamp"
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv" || return 1
    "$venv/bin/python" -m pip install --quiet --upgrade pip || return 1
    # The constraints file pins torch to the local CPU build (a bare torch would pull CUDA).
    "$venv/bin/python" -m pip install --quiet -c "$cons" "$@" || return 1
    "$venv/bin/python" -m pip freeze > "$venv/freeze.txt" || return 1
    printf '%s\n' "$want" > "$stamp"
    echo "[$name] done"
}

status=0
for p in "${peers[@]}"; do
    case "$p" in
        sb3) install_peer sb3 torch "gymnasium[mujoco]" stable-baselines3 || {
            echo "[sb3] install failed (see above)" >&2; status=1; } ;;
        rllib) install_peer rllib torch "gymnasium[mujoco]" "ray[rllib]" || {
            echo "[rllib] install failed (see above); the comparison skips RLlib" >&2; status=1; } ;;
        *) echo "unknown peer: $p" >&2; status=2 ;;
    esac
done
exit $status
