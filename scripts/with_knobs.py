"""Run a module as `python -m` would (or a script by its path), with module attributes set first (launch knobs of a
kernel module, for A/B runs of the same command in one device call; a development tool).

    python3 scripts/with_knobs.py attnv41.kernels.gemv._LOOP_STAGES8=3 attnv41.kernels.gemv._X1=1 \
        -- attnv41 bench --parts decode --weights fp8

Values are Python literals (`ast.literal_eval`); the attribute must exist. `module.attr[key]=value`
sets one key of a dict attribute (a launch-shape dict), which must hold that key.
"""

from __future__ import annotations

import ast
import importlib
import runpy
import sys


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit("usage: with_knobs.py module.attr=value ... -- module [args ...]")
    cut = argv.index("--")
    for item in argv[:cut]:
        target, _, value = item.partition("=")
        target, _, key = target.partition("[")
        mod, _, attr = target.rpartition(".")
        m = importlib.import_module(mod)
        if not hasattr(m, attr):
            raise SystemExit(f"{mod} has no attribute {attr}")
        if key:
            d, k = getattr(m, attr), ast.literal_eval(key.rstrip("]"))
            if k not in d:
                raise SystemExit(f"{target} has no key {k!r}")
            d[k] = ast.literal_eval(value)
            print(f"with_knobs: {target}[{k!r}] = {d[k]!r}", flush=True)
        else:
            setattr(m, attr, ast.literal_eval(value))
            print(f"with_knobs: {target} = {getattr(m, attr)!r}", flush=True)
    sys.argv = argv[cut + 1 :]
    if sys.argv[0].endswith(".py"):  # a script path
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
