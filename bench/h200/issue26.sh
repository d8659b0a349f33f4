#!/bin/bash
# Issue 26's measurements in one device call (the lent NVIDIA machine; results in TEST_RESULTS.md
# "GPU path: the registry and the resident kernels"). From the project root, with .gpu/ made by
# the GPU notes' prepare.sh (node, the pruned `webgpu`, the GL/Vulkan loaders) and, for the
# TensorFlow.js ratios, bench/tfjs/node_modules (npm ci there; or a tfjs_nm.tar.xz of it in the
# root, made by bench/h200/pack_tfjs.sh to fit the carry beside .gpu/, unpacked here):
#   bash bench/h200/issue26.sh      (writes under $OUT, default ./out)
#   rs_default/, rs_largest/   the resident 2-peer step vs the CPU backend on every core
#             (pick_and_resident.mjs residentStep; 300 and 60 steps, medians of the second half)
#   pick/     the registry's measured pick and the resident kernels' times (sections pick, resident)
#   cli_*     node frontend_js/cli.mjs --gpu resident --json (compare with python -m daisy.train --json)
#   tfjs_*    bench/bench_tfjs.mjs at the largest settings (and the default with TFJS_DEFAULT=1)
#   split/    one replica's local step and Adam step timed apart (default settings, one thread)
#   prof_*/   resident_profile.mjs: one replica's local step per kernel (GPU timestamps) and its
#             wall split, at the largest and the default settings
#   quant.jsonl, splitk.jsonl   dev/unit_quant and dev/gemm_splitk: the unit's kernels before and
#             after issue 26's second pass, per shape of the largest step, results compared
#   hs_largest/, hs_default/   host_split.mjs: the host's calls, read-back waits and GCs of each
#             local step and Adam, alone, in a 2-peer Group (vs the CPU Group), alone after CPU steps
#   clocks.csv   the GPU's clocks, P-state and use every 100 ms through the whole call (nvidia-smi)
# Each part is bounded by `timeout`; the sum of the bounds is over one 10-minute device call, so
# PART=1 (rs, hs_*, pick, cli_*) and PART=2 (tfjs_*, split, prof_*, quant, splitk) split it in two
# calls (each packs its own issue26N.tgz); unset runs both.
set -u
PART=${PART:-all}; in_part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
# Everything is written under $RUN_DIR and packed into $OUT/issue26.tgz at the end (the device
# tool brings back at most 8 files; the tarball is one).
FINAL_OUT=${OUT:-out}; mkdir -p "$FINAL_OUT"
OUT=${RUN_DIR:-/tmp/issue26}; rm -rf "$OUT"; mkdir -p "$OUT"
source .gpu/setup.sh > "$OUT/setup.txt" 2>&1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "cores: $(nproc)"; $NODE --version; } > "$OUT/machine.txt" 2>&1
if [ -f tfjs_nm.tar.xz ] && [ ! -d bench/tfjs/node_modules ]; then
  python3 -c "import tarfile; tarfile.open('tfjs_nm.tar.xz').extractall('bench/tfjs')"
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,pstate,utilization.gpu,power.draw --format=csv -lms 100 > "$OUT/clocks.csv" 2>&1 & CLOCKS=$!
LARGEST="--width 128 --seq-len 128 --batch 32"     # the five settings at their most
t0=$(date +%s); stamp() { echo "$1: $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"; pkill -9 -f pick_and_resident; pkill -9 -f bench_tfjs; pkill -9 -f cli.mjs; pkill -9 -f resident_profile; pkill -9 -f host_split; pkill -9 -f /bench.mjs; sleep 1; }
if in_part 1; then
# long runs, their first half left out of the medians: at the default settings the GPU's clock took
# seconds to climb (TEST_RESULTS "The resident step measured again, on lent H100s")
OUT=$OUT/rs_default DAISY_SETTINGS=default DAISY_STEPS=300 DAISY_WARM_STEPS=150 DAISY_SPLIT=0 DAISY_SECTIONS=residentStep timeout 60 $NODE bench/h200/pick_and_resident.mjs > "$OUT/rs_default.log" 2>&1; echo "exit $?" >> "$OUT/rs_default.log"; stamp rs_default
OUT=$OUT/rs_largest DAISY_SETTINGS=largest DAISY_STEPS=60 DAISY_WARM_STEPS=30 DAISY_SPLIT=0 DAISY_SECTIONS=residentStep timeout 90 $NODE bench/h200/pick_and_resident.mjs > "$OUT/rs_largest.log" 2>&1; echo "exit $?" >> "$OUT/rs_largest.log"; stamp rs_largest
OUT=$OUT/hs_largest STEPS=12 timeout 90 $NODE bench/h200/host_split.mjs > "$OUT/hs_largest.log" 2>&1; echo "exit $?" >> "$OUT/hs_largest.log"; stamp hs_largest
OUT=$OUT/hs_default STEPS=12 DAISY_SETTINGS_JSON='{"width":32,"seq_len":32,"batch":8}' timeout 60 $NODE bench/h200/host_split.mjs > "$OUT/hs_default.log" 2>&1; echo "exit $?" >> "$OUT/hs_default.log"; stamp hs_default
OUT=$OUT/pick DAISY_STEPS=40 DAISY_WARM_STEPS=20 DAISY_SECTIONS=pick,resident timeout 150 $NODE bench/h200/pick_and_resident.mjs > "$OUT/pick.log" 2>&1; echo "exit $?" >> "$OUT/pick.log"; stamp pick
timeout 60 $NODE frontend_js/cli.mjs --gpu resident --json --stop-after 30 > "$OUT/cli_default.jsonl" 2> "$OUT/cli_default.err"; stamp cli_default
timeout 50 $NODE frontend_js/cli.mjs --gpu resident --json --stop-after 2 $LARGEST > "$OUT/cli_largest.jsonl" 2> "$OUT/cli_largest.err"; stamp cli_largest
fi
if in_part 2; then
if [ -d bench/tfjs/node_modules ]; then
  timeout 150 $NODE bench/bench_tfjs.mjs --steps 3 --warmup 1 --webgpu $LARGEST > "$OUT/tfjs_largest.jsonl" 2>&1; stamp tfjs_largest
  [ -n "${TFJS_DEFAULT:-}" ] && { timeout 30 $NODE bench/bench_tfjs.mjs --steps 10 --webgpu > "$OUT/tfjs_default.jsonl" 2>&1; stamp tfjs_default; }
fi
# one replica's local step and Adam timed apart, default settings, one thread (segfaulted on the H100)
OUT=$OUT/split DAISY_THREADS=1 DAISY_SETTINGS=default DAISY_SECTIONS=residentStep timeout 40 $NODE bench/h200/pick_and_resident.mjs > "$OUT/split.log" 2>&1; echo "exit $?" >> "$OUT/split.log"; stamp split
OUT=$OUT/prof_largest timeout 120 $NODE bench/h200/resident_profile.mjs > "$OUT/prof_largest.log" 2>&1; echo "exit $?" >> "$OUT/prof_largest.log"; stamp prof_largest
OUT=$OUT/prof_default DAISY_PROFILE_SETTINGS='{"width":32,"seq_len":32,"batch":8}' timeout 60 $NODE bench/h200/resident_profile.mjs > "$OUT/prof_default.log" 2>&1; echo "exit $?" >> "$OUT/prof_default.log"; stamp prof_default
timeout 90 $NODE dev/unit_quant/bench.mjs > "$OUT/quant.jsonl" 2>&1; echo "exit $?" >> "$OUT/quant.jsonl"; stamp quant
timeout 60 $NODE dev/gemm_splitk/bench.mjs > "$OUT/splitk.jsonl" 2>&1; echo "exit $?" >> "$OUT/splitk.jsonl"; stamp splitk
fi
kill $CLOCKS
tar czf "$FINAL_OUT/issue26${PART/all/}.tgz" -C "$OUT" .
cat "$OUT/times.txt"; exec 2>/dev/null
# the figures TEST_RESULTS records, in brief (every file is in the tarball)
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(path):
    try: return json.load(open(os.path.join(out, path)))
    except (OSError, ValueError): return None
for name in ('rs_default', 'rs_largest'):
    d = load(f'{name}/pick_resident.json')
    for k, v in ((d or {}).get('sections', {}).get('residentStep') or {}).items():
        if isinstance(v, dict) and 'cpuMs' in v:
            print(f"resident 2-peer step, {k}: {v['residentMs']:.1f} ms vs CPU {v['cpuMs']:.1f} ms = {v['residentVsCpu']:.2f}x, hashes equal: {v['hashesEqual']}")
for name in ('hs_default', 'hs_largest'):
    g = ((load(f'{name}/host_split.json') or {}).get('scenes') or {}).get('group')
    if g: print(f"{name} group step {g['step']['wallMs']:.1f} ms vs CPU {g['cpuStepMs']:.1f} = {g['stepRatio']:.2f}x, hashes equal: {g['hashesEqual']}")
for k, v in (((load('pick/pick_resident.json') or {}).get('sections') or {}).get('pick') or {}).items():
    if isinstance(v, dict) and 'picked' in v:
        print(f"pick, {k}: {v['picked']['pathLabel']} | picked path {v['pickedMs']:.1f} ms vs CPU {v['cpuMs']:.1f} = {v['pickedVsCpu']:.2f}x, hashes equal: {v['hashesEqual']}")
PY
tail -n 8 "$OUT"/split.log; cat "$OUT"/quant.jsonl "$OUT"/splitk.jsonl; tail -n 12 "$OUT"/prof_largest.log
