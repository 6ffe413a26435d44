# Sourced by bin/attnv41 and bin/test: make sure .venv/ at the repo root holds what
# the project needs, (re)installing when pyproject.toml changed since the last setup.
# Machines without a GPU get the CPU build of PyTorch (torch==2.13.0, a local wheel on
# our machines); with `nvidia-smi` present, pip picks a CUDA build (torch>=2.11).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/bin/_venv.sh" | sha256sum | cut -c1-16)"
stamp="$VENV/.attnv41-setup"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "attnv41: setting up $VENV (first run or dependencies changed) ..." >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install -q "torch>=2.11" >&2
  else
    # Triton pinned to the release our interpreter tests were written against (the CUDA
    # builds of torch bring their own).
    "$VENV/bin/python" -m pip install -q "torch==2.13.0" "triton==3.6.0" >&2
  fi
  "$VENV/bin/python" -m pip install -q -e "$ROOT[dev]" >&2
  echo "$want" > "$stamp"
fi
