"""Run `python -m attnv41.bench.sass` without TRITON_INTERPRET (the tests' own process
interprets Triton): the decode kernels compiled for sm_90, no GPU needed.

The compiles run in a child process kept for the test process's life (one per set of
`ATTNV41_*` variables, which the kernels read when imported): importing torch, Triton and
attnv41 again for each of the suite's ~40 compiles cost more than most compiles do on CI's
cores. `bench.sass.main` restores every hook it sets (`compile_only`), so one compile
leaves nothing behind for the next; a compile already made in this process is answered
from memory (a copy)."""

from __future__ import annotations

import atexit
import copy
import json
import os
import select
import subprocess
import sys
import tempfile

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
TIMEOUT_S = 600  # one compile (the slowest, the Gluon kernels, take tens of seconds on 2 cores)

_workers: dict[tuple, tuple[subprocess.Popen, object]] = {}  # env key -> (child, its stderr file)
_done: dict[tuple, dict] = {}  # (env key, args) -> reports


def _env_key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith("ATTNV41_")))


def _worker(env: dict, key: tuple):
    if key in _workers and _workers[key][0].poll() is None:
        return _workers[key]
    err = tempfile.TemporaryFile(mode="w+")
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
    )  # fmt: skip
    _workers[key] = (child, err)
    return _workers[key]


def _close() -> None:
    for child, err in _workers.values():
        if child.poll() is None:
            child.stdin.close()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        err.close()


atexit.register(_close)


def compiled(*args: str) -> dict:
    """{kernel name: report} of `python -m attnv41.bench.sass *args --ttgir`."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.abspath(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    key = _env_key(env)
    if (key, args) not in _done:
        child, err = _worker(env, key)
        child.stdin.write(json.dumps([*args, "--ttgir"]) + "\n")
        child.stdin.flush()
        ready, _, _ = select.select([child.stdout], [], [], TIMEOUT_S)
        line = child.stdout.readline() if ready else ""
        reply = json.loads(line) if line else None
        if reply is None or not reply["ok"]:
            if reply is None:  # died or hung: the next compile starts a fresh child
                child.kill()
                child.wait()
            err.seek(0)
            why = reply["error"] if reply else f"no answer in {TIMEOUT_S} s (rc {child.poll()})"
            raise AssertionError(f"offline sm_90 compile failed ({' '.join(args)}):\n{why}\n{err.read()[-3000:]}")
        _done[key, args] = {k["name"]: k for k in reply["kernels"]}
    return copy.deepcopy(_done[key, args])


def _serve() -> None:
    """The child: one JSON argument list per line in, one JSON reply per line out. The
    replies go to a copy of fd 1; fd 1 itself goes to stderr, so nothing a compiler
    prints can break a reply."""
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415
    import traceback  # noqa: PLC0415

    from attnv41.bench import sass  # noqa: PLC0415

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                sass.main(json.loads(line))
            reply = dict(ok=True, kernels=json.loads(buf.getvalue().strip().splitlines()[-1]))
        except BaseException:  # noqa: BLE001 (argparse exits by SystemExit: reported, not fatal)
            reply = dict(ok=False, error=traceback.format_exc()[-3000:])
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
