#!/usr/bin/env bash
# 2026-12-04 (sixteenth entry), call 6: why the one-pass Gluon attention (bf16 rows, opt-in)
# loses inside the batched step (fifteenth entry): Nsight Compute on the step's own attention
# launches (graph nodes of BatchGraphs, B = 64 at 32K), with the L2 left as the step leaves it
# (--cache-control none) and flushed (all); the Triton pair likewise. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
T0=$(date +%s)
MET=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum
run() {  # name, env switch, kernel regex, skip, count, cache
  env ATTNV41_GLUON_ATTN=$2 timeout -k 5 130 ncu --graph-profiling node --cache-control $6 --clock-control none \
    --kernel-name "regex:$3" --launch-skip $4 --launch-count $5 --metrics $MET \
    python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16 --rounds 1 --steps 3 --variants new \
    > "$OUT/ncu_$1.txt" 2>&1
  echo "== $1 rc $? at $(($(date +%s) - T0)) s"
  grep -E "^  [_a-z]|duration|bytes_read|bytes_write|hit_rate|srcunit" "$OUT/ncu_$1.txt" | awk '{print $1, $(NF-1), $NF}' | head -40
}
run gluon_step 1 "_attn_gl_kernel" 80 3 none
run gluon_flushed 1 "_attn_gl_kernel" 80 2 all
run triton_step 0 "_logits_kernel|_pv_combine_kernel" 160 4 none
run triton_flushed 0 "_logits_kernel|_pv_combine_kernel" 160 4 all
