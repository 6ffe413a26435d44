#!/usr/bin/env bash
# 2026-12-03 (ninth entry): the logits kernel's column chunk (dk), fmt_dots and stages at
# B = 64 (BATCH_TUNE base) and at B = 1 (the single-sequence _TUNE base, also head blocks),
# three rounds in turn each (scripts/attn_ncu.py --time --rounds 3), bytes against production.
# carry: nothing
set -u
export PYTHONUNBUFFERED=1
timeout -k 5 "${T_S:-150}" python3 scripts/attn_ncu.py --batch 64 --rounds 3 --time '[{"dk": 64}, {"dk": 32}, {"dk": 64, "stages_a": 3}, {"dk": 64, "stages_a": 1}, {"dk": 32, "stages_a": 3}, {"dk": 64, "fmt_dots": true}, {"dk": 32, "fmt_dots": true}, {"dk": 32, "fmt_dots": true, "stages_a": 3}]'
echo "rc $?"
timeout -k 5 "${T_S:-150}" python3 scripts/attn_ncu.py --batch 1 --base single --rounds 3 --time '[{"dk": 64}, {"dk": 32}, {"bh": 32}, {"bh": 16}, {"bh": 32, "dk": 64}, {"bh": 16, "dk": 64}, {"dk": 64, "stages_a": 2}, {"dk": 32, "fmt_dots": true}]'
echo "rc $?"
