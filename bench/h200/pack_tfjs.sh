#!/bin/bash
# The TensorFlow.js packages of bench/bench_tfjs.mjs packed for the lent machine (no registry
# there): bench/tfjs/node_modules (npm ci in bench/tfjs first) without source maps, type files,
# the bundles Node does not load and tfjs's miniprogram build -> tfjs_nm.tar.xz in the root
# (~6 MB; unpruned, ~29 MB, which with .gpu/ passes the device tool's 64-MiB carry).
# issue26.sh unpacks it into bench/tfjs when that has no node_modules.   bash bench/h200/pack_tfjs.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
[ -d bench/tfjs/node_modules ] || { echo "no bench/tfjs/node_modules: run npm ci in bench/tfjs first" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp -r bench/tfjs/node_modules "$tmp/"
find "$tmp/node_modules" \( -name '*.map' -o -name '*.d.ts' \) -delete
find "$tmp/node_modules" -path '*/dist/*' \( -name '*.min.js' -o -name '*.es2017.js' -o -name '*.fesm.js' -o -name '*.esm.js' \) -delete
rm -rf "$tmp/node_modules/@tensorflow/tfjs/dist/miniprogram"
tar -C "$tmp" -cf - node_modules | xz -T2 -6 > tfjs_nm.tar.xz
ls -la tfjs_nm.tar.xz
