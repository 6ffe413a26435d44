"""Prefix each line of stdin with seconds since start (pytest -v output from a run that
may be killed at its time limit, when --durations never prints); with --top N, instead
read such a log and print the N lines that took the longest (time since the line before)."""

import sys
import time

if len(sys.argv) > 2 and sys.argv[1] == "--top":
    rows = []
    for line in open(sys.argv[3] if len(sys.argv) > 3 else "/dev/stdin"):
        t, _, rest = line.strip().partition(" ")
        try:
            rows.append((float(t), rest))
        except ValueError:
            continue
    took = [(b[0] - a[0], b[1]) for a, b in zip(rows, rows[1:])]  # pytest -v ends a line when its test ends
    for dt, what in sorted(took, reverse=True)[: int(sys.argv[2])]:
        print(f"{dt:7.1f}  {what[:150]}")
else:
    t0 = time.time()
    for line in sys.stdin:
        print(f"{time.time() - t0:7.1f} {line}", end="", flush=True)
