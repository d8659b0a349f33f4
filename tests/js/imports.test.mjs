// The module graph of frontend_js/: its layers (page -> run -> mesh -> numeric core), no import
// cycle (a cycle makes a module's bindings depend on which file loads first), and no module-level
// state in the modules a backend is built from (engines.js chooses every part once, in one place:
// docs/ARCHITECTURE.md "Compute").
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';

const FRONTEND = resolve(dirname(fileURLToPath(import.meta.url)), '../../frontend_js');

// `import ... from './a.js'` (over lines), `export ... from`, `import './a.js'`, `import('./a.js')`
const STATIC = /(?:^|\n)\s*(?:import|export)\b[^'"`;]*?\bfrom\s*(['"])([^'"\n]+)\1|(?:^|\n)\s*import\s*(['"])([^'"\n]+)\3/g;
const DYNAMIC = /\bimport\(\s*(['"])([^'"\n]+)\1\s*\)/g;

// dir -> Map(file relative to dir -> [relative files it imports]); specifiers other than ./ and ../
// (node:fs, bare names) are outside the graph
export function importGraph(dir) {
  const graph = new Map();
  const walk = (d) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.m?js$/.test(e.name)) {
        const src = readFileSync(p, 'utf8'), deps = [];
        for (const m of src.matchAll(STATIC)) deps.push(m[2] ?? m[4]);
        for (const m of src.matchAll(DYNAMIC)) deps.push(m[2]);
        graph.set(relative(dir, p), deps.filter((s) => s.startsWith('./') || s.startsWith('../'))
          .map((s) => relative(dir, resolve(dirname(p), s))));
      }
    }
  };
  walk(dir);
  return graph;
}

// graph -> the cycles found by a depth-first walk, each as [a, b, ..., a]
export function findCycles(graph) {
  const state = new Map(), stack = [], cycles = [];
  const visit = (f) => {
    state.set(f, 'open');
    stack.push(f);
    for (const g of graph.get(f) || []) {
      if (state.get(g) === 'open') cycles.push([...stack.slice(stack.indexOf(g)), g]);
      else if (!state.has(g)) visit(g);
    }
    stack.pop();
    state.set(f, 'done');
  };
  for (const f of [...graph.keys()].sort()) if (!state.has(f)) visit(f);
  return cycles;
}

const named = (cycles) => cycles.map((c) => c.join(' -> ')).join('; ');

test('frontend_js/ has no import cycle', () => {
  const graph = importGraph(FRONTEND);
  assert.ok(graph.get('train.js').includes('engines.js'), 'the walker missed train.js -> engines.js');
  assert.ok(graph.get('backends.js').includes('gpu/gpu.js'), 'the walker missed backends.js\'s import(\'./gpu/gpu.js\')');
  assert.ok(graph.get('kit/kit.js').includes('model.js'), 'the walker missed kit/kit.js -> ../model.js');
  const cycles = findCycles(graph);
  assert.equal(cycles.length, 0, `import cycle(s): ${named(cycles)}`);
});

test('the cycle check finds and names a cycle (real files, multi-line and dynamic imports)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'daisy-imports-'));
  try {
    mkdirSync(join(dir, 'sub'));
    writeFileSync(join(dir, 'a.js'), "import {\n  x,\n  y,\n} from './sub/b.js';\nexport const a = 1;\n");
    writeFileSync(join(dir, 'sub', 'b.js'), "export { c } from '../c.js';\nimport 'node:fs';\n");
    writeFileSync(join(dir, 'c.js'), "export const c = async () => import('./a.js');\n");
    writeFileSync(join(dir, 'd.js'), "import { a } from './a.js';\n");
    assert.equal(named(findCycles(importGraph(dir))), `a.js -> ${join('sub', 'b.js')} -> c.js -> a.js`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// the modules a backend's parts come from: any state lives in the backend object, not here
// (and the GPU engine's modules and the frame codec: their choices belong to their owners too)
const BACKEND_MODULES = ['engines.js', 'model.js', 'optim.js', 'hashing.js', 'wasm_float.js', 'wasm_gemm.js',
  'units.js', 'train.js', 'generate.js', 'gpu/gpu.js', 'gpu/device.js', 'gpu/gemm_kernel.js', 'gpu/wasm_host.js',
  'gpu/route.js', 'gpu/engine.js', 'gpu/gpu_gates.js', 'mesh/frames.js', 'host.js', 'bits.js',
  'backends.js', 'cpu/workers.js', 'cpu/threads.js', 'cpu/thread_jobs.js', 'cpu/unit_workers.js'];

test('no module-level mutable state in the backend modules', () => {
  const found = [];
  for (const f of BACKEND_MODULES) {
    readFileSync(join(FRONTEND, f), 'utf8').split('\n').forEach((line, i) => {
      if (/^(export\s+)?(let|var)\s/.test(line)) found.push(`${f}:${i + 1}: ${line.trim()}`);
    });
  }
  assert.deepEqual(found, [], `module-level let/var (backend state belongs in engines.js's backend objects):\n${found.join('\n')}`);
});

// The layers (docs/ARCHITECTURE.md "The layers of frontend_js/"), low to high: the numeric core
// (the mirror of daisy/: top-level modules, gpu/, cpu/, kit/), the mesh (mesh/), the run (run/),
// the page (peer/, and headless.mjs, the page's Peer hosted by Node). A module imports only from
// its own layer and those below it, never up (page, run and mesh are one folder each: nothing is
// beside them).
const LAYERS = ['core', 'mesh', 'run', 'page'];
export function layerOf(file) {
  const top = file.split(/[\\/]/)[0];
  if (top === 'peer' || file === 'headless.mjs') return 'page';
  if (top === 'run' || top === 'mesh') return top;
  return 'core';
}

// graph -> every import that goes up or sideways, as 'a -> b (layer -> layer)'
export function layerViolations(graph) {
  const rank = (f) => LAYERS.indexOf(layerOf(f));
  return [...graph].flatMap(([f, deps]) => deps.filter((g) => rank(g) > rank(f))
    .map((g) => `${f} -> ${g} (${layerOf(f)} -> ${layerOf(g)})`));
}

test('frontend_js/ keeps its layers: page -> run -> mesh -> numeric core, never up', () => {
  const graph = importGraph(FRONTEND);
  // the walker sees each layer's imports of the one below (a check that looks at nothing passes)
  for (const [f, g] of [['peer/peer.js', 'run/controller.js'], ['run/controller.js', 'mesh/mesh_collective.js'],
    ['mesh/mesh_collective.js', 'collective.js'], ['peer/group_state.js', 'peer_state.js'], ['headless.mjs', 'peer/peer.js']]) {
    assert.ok(graph.get(f).includes(g), `the walker missed ${f} -> ${g}`);
  }
  const bad = layerViolations(graph);
  assert.deepEqual(bad, [], `imports against the layers:\n${bad.join('\n')}`);
});

test('the layer check names each upward import (real files, static and dynamic)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'daisy-layers-'));
  try {
    for (const d of ['peer', 'run', 'mesh']) mkdirSync(join(dir, d));
    writeFileSync(join(dir, 'model.js'), "export { Mesh } from './mesh/mesh.js';\n");              // core -> mesh: up
    writeFileSync(join(dir, 'mesh', 'mesh.js'), "import { x } from '../model.js';\nexport const Mesh = 1;\n");
    writeFileSync(join(dir, 'run', 'loop.js'), "const p = () => import('../peer/ui.js');\n");   // run -> page: up
    writeFileSync(join(dir, 'peer', 'ui.js'), "import '../run/loop.js';\nimport '../mesh/mesh.js';\n");
    assert.deepEqual(layerViolations(importGraph(dir)).sort(), [
      `model.js -> ${join('mesh', 'mesh.js')} (core -> mesh)`,
      `${join('run', 'loop.js')} -> ${join('peer', 'ui.js')} (run -> page)`,
    ]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// one place picks the backend (docs/ARCHITECTURE.md "Compute"): the page and the CLI reach the
// worker backends and the GPU engine only through backends.js, and no backend imports another's
// internals (neither worker backend the other, the GPU nothing of cpu/, cpu/ nothing of gpu/)
test('the page and the CLI pick their backend only through backends.js', () => {
  const graph = importGraph(FRONTEND);
  assert.ok(graph.get('peer/peer.js').includes('backends.js'), 'the walker missed peer/peer.js\'s import(\'../backends.js\')');
  assert.ok(graph.get('cli.mjs').includes('backends.js'), 'the walker missed cli.mjs -> backends.js');
  const backends = ['cpu/threads.js', 'cpu/unit_workers.js', 'gpu/gpu.js', 'gpu/engine.js'];
  const bad = [...graph].filter(([f]) => f.startsWith('peer/') || f.startsWith('run/') || f === 'cli.mjs')
    .flatMap(([f, deps]) => deps.filter((g) => backends.includes(g)).map((g) => `${f} -> ${g}`));
  assert.deepEqual(bad, [], `a backend chosen outside backends.js: ${bad.join(', ')}`);
  for (const [a, b] of [backends.slice(0, 2), backends.slice(0, 2).reverse()]) assert.ok(!graph.get(a).includes(b), `${a} imports ${b}: shared pieces belong in cpu/workers.js`);
  const crossing = [...graph].flatMap(([f, deps]) => deps.filter((g) => (f.startsWith('gpu/') && g.startsWith('cpu/')) || (f.startsWith('cpu/') && g.startsWith('gpu/')))
    .map((g) => `${f} -> ${g}`));
  assert.deepEqual(crossing, [], `a backend imports another's internals: ${crossing.join(', ')}`);
});
