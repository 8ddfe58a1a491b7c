"""``nitro enjoy`` (watch a trained agent, record MP4s) and ``nitro export`` (policy files).

Both take a run directory (its newest checkpoint) or one checkpoint file, and need neither
the engine nor Redis. Videos go through gymnasium's ``RecordVideo`` (moviepy, with the ffmpeg
binary that imageio-ffmpeg ships). MuJoCo renders offscreen through OpenGL: on a machine
without a display ``MUJOCO_GL=egl`` works with Mesa's EGL, so ``enjoy`` sets it when unset;
``osmesa`` needs the libosmesa6 system package.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
RENDER_HINT = ("headless rendering needs an offscreen OpenGL: MUJOCO_GL=egl (Mesa's libegl1) "
               "or MUJOCO_GL=osmesa (apt-get install libosmesa6)")


def register(subparsers: Any) -> None:
    """Entry point of the ``nitro.commands`` group: adds ``enjoy`` and ``export``."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    enjoy = subparsers.add_parser(
        "enjoy", help="run a trained agent, print its returns, record videos",
        description="Play episodes with a trained policy (raw env rewards, the run's "
                    "observation normalisation) and print each return.", formatter_class=fmt)
    enjoy.add_argument("run_dir", metavar="RUN_DIR", help="a run directory or checkpoint file")
    enjoy.add_argument("--episodes", type=int, default=3, help="episodes to play")
    enjoy.add_argument("--seed", type=int, default=0, help="episode i resets with seed + i")
    enjoy.add_argument("--video", metavar="DIR", help="record one MP4 per episode into DIR")
    mode = enjoy.add_mutually_exclusive_group()
    mode.add_argument("--deterministic", dest="deterministic", action="store_true",
                      default=argparse.SUPPRESS,
                      help="most likely action, argmax or Gaussian mean (the default)")
    mode.add_argument("--stochastic", dest="deterministic", action="store_false",
                      default=argparse.SUPPRESS,
                      help="sample actions as the actors did in training")
    enjoy.set_defaults(handler=_enjoy)

    export = subparsers.add_parser(
        "export", help="write a standalone policy file (onnx, torchscript, safetensors)",
        description="Export the trained policy. ONNX and TorchScript files map raw "
                    "observations to actions with the normalisation baked in; safetensors "
                    "holds the weights and statistics.", formatter_class=fmt)
    export.add_argument("run_dir", metavar="RUN_DIR", help="a run directory or checkpoint file")
    export.add_argument("--format", required=True, choices=("onnx", "torchscript", "safetensors"),
                        help="file format")
    export.add_argument("--out", metavar="FILE",
                        help="output file (default: RUN_DIR/policy.onnx, .pt or .safetensors)")
    export.set_defaults(handler=_export)


def _fail(command: str, message: str, code: int) -> int:
    sys.stderr.write(f"nitro {command}: {message}\n")
    return code


def _load(path: str) -> Any:
    from plugins.agent.policy import Policy

    return Policy.load(path)


def _enjoy(args: argparse.Namespace) -> int:
    from plugins.agent.policy import PolicyLoadError

    if args.episodes < 1:
        return _fail("enjoy", f"--episodes must be at least 1, got {args.episodes}",
                     EXIT_BAD_INPUT)
    if args.video:
        # Before anything imports mujoco: it picks its OpenGL backend once, at import.
        os.environ.setdefault("MUJOCO_GL", "egl")
        # Classic-control envs draw rgb_array frames with pygame, which needs no window but
        # probes for a display (and prints an error on a headless machine) unless told.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        policy = _load(args.run_dir)
        env = policy.make_env(render_mode="rgb_array" if args.video else None)
    except PolicyLoadError as exc:
        return _fail("enjoy", str(exc), EXIT_BAD_INPUT)
    except Exception as exc:  # an env that cannot be built or rendered here
        return _fail("enjoy", _render_message(exc, bool(args.video)), EXIT_FAILED)
    try:
        if args.video:
            env, problem = _recording(env, Path(args.video), args.seed)
            if problem:
                return _fail("enjoy", problem, EXIT_FAILED)
        deterministic = getattr(args, "deterministic", True)
        returns = [_episode(policy, env, args.seed + i, deterministic, i)
                   for i in range(args.episodes)]
    finally:
        env.close()
    mean = sum(returns) / len(returns)
    sys.stdout.write(f"mean return {mean:.1f} over {len(returns)} episodes\n")
    if args.video:
        sys.stdout.write(f"videos in {args.video}\n")
    return EXIT_OK


def _render_message(exc: Exception, video: bool) -> str:
    """One line; the OpenGL hint only where a missing package is not the plain cause."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if not video or isinstance(exc, ImportError) or "not installed" in text:
        return text
    return f"{text}; {RENDER_HINT}"


def _recording(env: Any, folder: Path, seed: int) -> tuple[Any, str | None]:
    """Wrap ``env`` in ``RecordVideo`` after one trial frame, so a machine that cannot render
    gets one line saying how to fix it instead of a traceback from deep in OpenGL."""
    try:
        import moviepy  # noqa: F401  (RecordVideo needs it to write MP4s)
    except ImportError:
        return env, "recording videos needs moviepy: pip install 'nitro-rl[video]'"
    try:
        env.reset(seed=seed)
        frame = env.render()
    except Exception as exc:
        return env, _render_message(exc, True)
    if frame is None:
        return env, f"{env.spec.id if env.spec else 'the env'} renders no rgb_array frames"
    from gymnasium.wrappers import RecordVideo

    name = (env.spec.id if env.spec else "agent").replace("/", "-")
    recorder = RecordVideo(env, str(folder), episode_trigger=lambda _: True, name_prefix=name,
                           disable_logger=True)
    return recorder, None


def _episode(policy: Any, env: Any, seed: int, deterministic: bool, index: int) -> float:
    obs, _ = env.reset(seed=seed)
    if not deterministic:
        policy.reseed(seed)
    total, steps, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy.predict(obs, deterministic))
        total += float(reward)
        steps += 1
        done = bool(terminated or truncated)
    sys.stdout.write(f"episode {index + 1}: return {total:.1f}, length {steps}\n")
    return total


def _export(args: argparse.Namespace) -> int:
    from plugins.agent.policy import PolicyLoadError

    try:
        policy = _load(args.run_dir)
    except PolicyLoadError as exc:
        return _fail("export", str(exc), EXIT_BAD_INPUT)
    try:
        from plugins.agent.export import FORMATS, export
    except ImportError as exc:
        return _fail("export", f"{exc}; install torch", EXIT_FAILED)
    run_dir = Path(args.run_dir) if Path(args.run_dir).is_dir() else Path(args.run_dir).parent
    out = Path(args.out) if args.out else run_dir / f"policy{FORMATS[args.format]}"
    try:
        export(policy, args.format, out)
    except ImportError as exc:
        extra = "onnx" if args.format == "onnx" else "safetensors"
        return _fail("export", f"{exc.msg}; pip install 'nitro-rl[{extra}]'", EXIT_FAILED)
    sys.stdout.write(f"{out}\n")
    return EXIT_OK
