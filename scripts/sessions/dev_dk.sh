#!/usr/bin/env bash
# For the next session (written 2026-12-03, eighth entry; not yet run): the logits kernel's column chunk (dk) at B = 64 on synthetic step
# shapes (scripts/attn_ncu.py --time): packed rows' logits compile to 254 registers at
# dk = 128 (two programs per SM), 168 at 64 (three), 127 at 32 (four); with fmt_dots (one dot
# per format present in a block) 179 at 128, 148 at 64. Bytes against production.
# carry: nothing (no golden files needed)
set -u
export PYTHONUNBUFFERED=1
timeout -k 5 "${T_S:-80}" python3 scripts/attn_ncu.py --batch 64 --time '[{"dk": 64}, {"dk": 32}, {"dk": 64, "fmt_dots": true}, {"dk": 32, "fmt_dots": true}, {"stages_a": 3}]'
echo "rc $?"
