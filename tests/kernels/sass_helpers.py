"""Run `python -m attnv41.bench.sass` in a subprocess without TRITON_INTERPRET (the tests'
own process interprets Triton): the decode kernels compiled for sm_90, no GPU needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def compiled(*args: str) -> dict:
    """{kernel name: report} of `python -m attnv41.bench.sass *args --ttgir`."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.abspath(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "attnv41.bench.sass", *args, "--ttgir"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"offline sm_90 compile failed ({' '.join(args)}):\n{r.stderr[-3000:]}"
    return {k["name"]: k for k in json.loads(r.stdout.strip().splitlines()[-1])}
