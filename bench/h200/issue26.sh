#!/bin/bash
# Issue 26's measurements in one device call (the lent NVIDIA machine; results in TEST_RESULTS.md
# "GPU path: the registry and the resident kernels"). From the project root, with .gpu/ made by
# the GPU notes' prepare.sh (node, the pruned `webgpu`, the GL/Vulkan loaders) and, for the
# TensorFlow.js ratios, bench/tfjs/node_modules (npm ci there; or a tfjs_nm.tar.xz of it in the
# root, unpacked here):   bash bench/h200/issue26.sh      (writes under $OUT, default ./out)
#   rs/       the resident step vs the CPU backend on every core (pick_and_resident.mjs residentStep)
#   cli_*     node frontend_js/cli.mjs --gpu resident --json (compare with python -m daisy.train --json)
#   pick/     the registry's measured pick and the resident kernels' times (sections pick, resident)
#   tfjs_*    bench/bench_tfjs.mjs at the default and the largest settings (wasm, and WebGPU)
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
source .gpu/setup.sh > "$OUT/setup.txt" 2>&1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "cores: $(nproc)"; $NODE --version; } > "$OUT/machine.txt" 2>&1
if [ -f tfjs_nm.tar.xz ] && [ ! -d bench/tfjs/node_modules ]; then
  python3 -c "import tarfile; tarfile.open('tfjs_nm.tar.xz').extractall('bench/tfjs')"
fi
LARGEST="--width 128 --seq-len 128 --batch 32 --layers 8 --heads 8"
t0=$(date +%s); stamp() { echo "$1: $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"; }
OUT=$OUT/rs DAISY_SECTIONS=residentStep timeout 150 $NODE bench/h200/pick_and_resident.mjs > "$OUT/rs.log" 2>&1; stamp residentStep
timeout 30 $NODE frontend_js/cli.mjs --gpu resident --json --stop-after 30 > "$OUT/cli_default.jsonl" 2> "$OUT/cli_default.err"; stamp cli_default
timeout 40 $NODE frontend_js/cli.mjs --gpu resident --json --stop-after 3 $LARGEST > "$OUT/cli_largest.jsonl" 2> "$OUT/cli_largest.err"; stamp cli_largest
if [ -d bench/tfjs/node_modules ]; then
  timeout 30 $NODE bench/bench_tfjs.mjs --steps 10 --webgpu > "$OUT/tfjs_default.jsonl" 2>&1; stamp tfjs_default
  timeout 50 $NODE bench/bench_tfjs.mjs --steps 5 --warmup 2 --webgpu $LARGEST > "$OUT/tfjs_largest.jsonl" 2>&1; stamp tfjs_largest
fi
OUT=$OUT/pick DAISY_SECTIONS=pick,resident timeout 80 $NODE bench/h200/pick_and_resident.mjs > "$OUT/pick.log" 2>&1; stamp pick
