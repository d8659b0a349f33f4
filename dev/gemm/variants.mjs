// GEMM kernel variants for dev/gemm/gemm_bench.mjs: each builds a module whose `gemm` export has
// the mainline signature and operand contract gemm(aPtr, bPtr, cPtr, batch, M, N, Kp)
// (frontend_js/wasm_gemm.js: int16 A (batch, M, Kp), B^T (batch, N, Kp), M even, N a multiple of
// 4, Kp of 8; int32 C). All are exact integer arithmetic, so any tiling or order gives the same C.
import { Module, local, loop, if_, br_if, select, call, return_, forRange, i32, v128, V128_ZERO, i8x16, i32x4, whileStep } from '../../frontend_js/wasm_asm.js';

const shuffle32 = (lanes) => i8x16.shuffle(...lanes.flatMap((l) => [4 * l, 4 * l + 1, 4 * l + 2, 4 * l + 3]));
// [sum a, sum b, sum c, sum d] of four i32x4 locals (exact wrapping adds; scratch s01, s23), as
// in the mainline kernel
const hsum4Of = (L, a, b, c, d) => [
  local.get(a), local.get(b), shuffle32([0, 1, 4, 5]), local.get(a), local.get(b), shuffle32([2, 3, 6, 7]), i32x4.add,
  local.get(c), local.get(d), shuffle32([0, 1, 4, 5]), local.get(c), local.get(d), shuffle32([2, 3, 6, 7]), i32x4.add,
  local.set(L.s23), local.set(L.s01),
  local.get(L.s01), local.get(L.s23), shuffle32([0, 2, 4, 6]), local.get(L.s01), local.get(L.s23), shuffle32([1, 3, 5, 7]), i32x4.add,
];
const PARAMS = 'aPtr bPtr cPtr batch M N Kp';
// aBase, bBase and c = the operands' and C's first bytes in batch bi (rowB: bytes per operand row, a constant)
const batchBases = (L, rowB, c) => [
  local.get(L.aPtr), local.get(L.bi), local.get(L.M), i32.mul, i32.const(rowB), i32.mul, i32.add, local.set(L.aBase),
  local.get(L.bPtr), local.get(L.bi), local.get(L.N), i32.mul, i32.const(rowB), i32.mul, i32.add, local.set(L.bBase),
  local.get(L.cPtr), local.get(L.bi), local.get(L.M), i32.mul, local.get(L.N), i32.mul, i32.const(2), i32.shl, i32.add, local.set(c),
];
const accName = (r, c) => `acc${r}_${c}`;
// the module's exported gemm: Kp in kps calls the body specialised for it (built by
// fixedBody(kp) with fixedLocals), any other Kp the generic 2x4 tile
function withDispatch(m, kps, fixedBody, fixedLocals) {
  const fixed = kps.map((kp) => m.func(null, { params: PARAMS, locals: fixedLocals }, fixedBody(kp)));
  const dyn = m.func(null, { params: PARAMS, locals: `bi i i0 iEnd j k kEnd rowB aBase bBase cBase pa0 pa1 pb0 pb1 pb2 pb3 ${[0, 1].flatMap((r) => [0, 1, 2, 3].map((c) => `${accName(r, c)}:v128`)).join(' ')} va0:v128 va1:v128 vb:v128 s01:v128 s23:v128` },
    tiledBody({ rows: 2, unroll: 1, rowBlock: 2 }));
  m.func('gemm', { params: PARAMS }, (L) => {
    const args = ['aPtr', 'bPtr', 'cPtr', 'batch', 'M', 'N', 'Kp'].map((p) => local.get(L[p]));
    const chain = (i) => (i === kps.length ? [args, call(dyn)]
      : [local.get(L.Kp), i32.const(kps[i]), i32.xor, i32.eqz, if_([args, call(fixed[i]), return_], chain(i + 1))]);
    return chain(0);
  });
  return m.bytes();
}

// tiled({rows, unroll, rowBlock}): tiles of `rows` A rows (2 or 4; M even, a last pair when
// rows = 4) x 4 B^T rows, the k loop unrolled `unroll` times (16-byte steps, then single
// steps), and the rows walked in blocks of rowBlock rows (a multiple of `rows`): for each
// block, for each column quad, for each tile of the block — so the block's A rows stay in L1
// while B^T streams once per block instead of once per tile.
export function tiled({ rows, unroll = 1, rowBlock = rows }) {
  const m = new Module();
  const R = [...Array(rows).keys()], Cq = [0, 1, 2, 3];
  m.func('gemm', {
    params: 'aPtr bPtr cPtr batch M N Kp',
    locals: `bi i i0 iEnd j k kEnd rowB aBase bBase cBase ${R.map((r) => `pa${r}`).join(' ')} ${Cq.map((c) => `pb${c}`).join(' ')}
      ${R.flatMap((r) => Cq.map((c) => `${accName(r, c)}:v128`)).join(' ')} ${R.map((r) => `va${r}:v128`).join(' ')} vb:v128 s01:v128 s23:v128`,
  }, tiledBody({ rows, unroll, rowBlock }));
  return m.bytes();
}
function tiledBody({ rows, unroll, rowBlock }) {
  const R = [...Array(rows).keys()], Cq = [0, 1, 2, 3];
  return (L) => {
    const hsum4 = (...accs) => hsum4Of(L, ...accs);
    // one tile of nr rows at row i, column quad j
    const tile = (nr) => {
      const rs = R.slice(0, nr);
      const kStep = (off) => [
        rs.map((r) => [local.get(L[`pa${r}`]), local.get(L.k), i32.add, v128.load(off), local.set(L[`va${r}`])]),
        Cq.map((c) => [
          local.get(L[`pb${c}`]), local.get(L.k), i32.add, v128.load(off), local.set(L.vb),
          rs.map((r) => [local.get(L[accName(r, c)]), local.get(L[`va${r}`]), local.get(L.vb), i32x4.dot_i16x8_s, i32x4.add, local.set(L[accName(r, c)])]),
        ]),
      ];
      return [
        rs.map((r) => [local.get(L.aBase), local.get(L.i), i32.const(r), i32.add, local.get(L.rowB), i32.mul, i32.add, local.set(L[`pa${r}`])]),
        rs.flatMap((r) => Cq.map((c) => [V128_ZERO, local.set(L[accName(r, c)])])),
        i32.const(0), local.set(L.k),
        // do-while loops (the test at the bottom, one branch per pass): kEnd = rowB rounded down
        // to whole unrolled passes, then single 16-byte steps up to rowB
        unroll > 1 ? [local.get(L.rowB), i32.const(-16 * unroll), i32.and, local.tee(L.kEnd), if_([loop(
          [...Array(unroll).keys()].map((u) => kStep(16 * u)),
          local.get(L.k), i32.const(16 * unroll), i32.add, local.tee(L.k), local.get(L.kEnd), i32.lt_u, br_if(0))])] : [],
        local.get(L.k), local.get(L.rowB), i32.lt_u, if_([loop(
          kStep(0), local.get(L.k), i32.const(16), i32.add, local.tee(L.k), local.get(L.rowB), i32.lt_u, br_if(0))]),
        rs.map((r) => [
          local.get(L.cBase), local.get(L.i), i32.const(r), i32.add, local.get(L.N), i32.mul, local.get(L.j), i32.add, i32.const(2), i32.shl, i32.add,
          hsum4(...Cq.map((c) => L[accName(r, c)])), v128.store(),
        ]),
      ];
    };
    const colQuad = [
      ...Cq.map((c) => [local.get(L.bBase), local.get(L.j), i32.const(c), i32.add, local.get(L.rowB), i32.mul, i32.add, local.set(L[`pb${c}`])]),
      local.get(L.i0), local.set(L.i),
      whileStep(L.i, rows, L.iEnd, tile(rows)),
      rows > 2 ? whileStep(L.i, 2, L.iEnd, tile(2)) : [],
    ];
    const bBody = [
      local.get(L.aPtr), local.get(L.bi), local.get(L.M), i32.mul, local.get(L.rowB), i32.mul, i32.add, local.set(L.aBase),
      local.get(L.bPtr), local.get(L.bi), local.get(L.N), i32.mul, local.get(L.rowB), i32.mul, i32.add, local.set(L.bBase),
      local.get(L.cPtr), local.get(L.bi), local.get(L.M), i32.mul, local.get(L.N), i32.mul, i32.const(2), i32.shl, i32.add, local.set(L.cBase),
      i32.const(0), local.set(L.i0),
      loop(
        local.get(L.i0), i32.const(rowBlock), i32.add, local.tee(L.iEnd), local.get(L.M), local.get(L.iEnd), local.get(L.M), i32.lt_u,
        select, local.set(L.iEnd),                                        // iEnd = min(i0 + rowBlock, M)
        i32.const(0), local.set(L.j),
        loop(colQuad, local.get(L.j), i32.const(4), i32.add, local.tee(L.j), local.get(L.N), i32.lt_u, br_if(0)),
        local.get(L.iEnd), local.tee(L.i0), local.get(L.M), i32.lt_u, br_if(0),
      ),
      local.get(L.bi), i32.const(1), i32.add, local.tee(L.bi), local.get(L.batch), i32.lt_u, br_if(0),
    ];
    return [local.get(L.Kp), i32.const(1), i32.shl, local.set(L.rowB), i32.const(0), local.set(L.bi), loop(bBody)];
  };
}

// specialised({kps}): the 2x4 tile, specialised for each Kp in kps: with the row stride a constant,
// the 2 A rows and 4 B^T rows are one running pointer each plus static load offsets (2 address
// adds per 16-byte step instead of 6), the k loop unrolled up to unrollMax times as Kp/8 allows;
// fold: B^T loaded at each use (no vb register). Other Kp take the generic 2x4 tile; gemm
// dispatches on Kp.
export function specialised({ kps, unrollMax = 4, fold = false }) {
  const m = new Module();
  const ACC = [0, 1].flatMap((r) => [0, 1, 2, 3].map((c) => `acc${r}_${c}`));
  const body = (kp) => (L) => {
    const rowB = kp * 2, steps = kp / 8, unroll = [unrollMax, 2, 1].find((u) => steps % u === 0);
    const hsum4 = (...accs) => hsum4Of(L, ...accs);
    const kStep = (off) => [
      local.get(L.pa), v128.load(off), local.set(L.va0), local.get(L.pa), v128.load(off + rowB), local.set(L.va1),
      fold ? [0, 1, 2, 3].map((c) => [0, 1].map((r) => [local.get(L[ACC[r * 4 + c]]), local.get(L[`va${r}`]), local.get(L.pb), v128.load(off + c * rowB),
        i32x4.dot_i16x8_s, i32x4.add, local.set(L[ACC[r * 4 + c]])]))
      : [0, 1, 2, 3].map((c) => [local.get(L.pb), v128.load(off + c * rowB), local.set(L.vb),
        [0, 1].map((r) => [local.get(L[ACC[r * 4 + c]]), local.get(L[`va${r}`]), local.get(L.vb), i32x4.dot_i16x8_s, i32x4.add, local.set(L[ACC[r * 4 + c]])])]),
    ];
    return [
      forRange(L.bi, L.batch, [
        batchBases(L, rowB, L.cRow),
        i32.const(0), local.set(L.i),
        loop(
          i32.const(0), local.set(L.j),
          loop(
            ACC.map((a) => [V128_ZERO, local.set(L[a])]),
            local.get(L.aBase), local.get(L.i), i32.const(rowB), i32.mul, i32.add, local.set(L.pa),
            local.get(L.bBase), local.get(L.j), i32.const(rowB), i32.mul, i32.add, local.tee(L.pb), i32.const(rowB), i32.add, local.set(L.pEnd),
            loop(
              [...Array(unroll).keys()].map((u) => kStep(16 * u)),
              local.get(L.pa), i32.const(16 * unroll), i32.add, local.set(L.pa),
              local.get(L.pb), i32.const(16 * unroll), i32.add, local.tee(L.pb), local.get(L.pEnd), i32.lt_u, br_if(0)),
            local.get(L.cRow), local.get(L.j), i32.const(2), i32.shl, i32.add, hsum4(...ACC.slice(0, 4).map((a) => L[a])), v128.store(),
            local.get(L.cRow), local.get(L.N), local.get(L.j), i32.add, i32.const(2), i32.shl, i32.add, hsum4(...ACC.slice(4).map((a) => L[a])), v128.store(),
            local.get(L.j), i32.const(4), i32.add, local.tee(L.j), local.get(L.N), i32.lt_u, br_if(0)),
          local.get(L.cRow), local.get(L.N), i32.const(3), i32.shl, i32.add, local.set(L.cRow),
          local.get(L.i), i32.const(2), i32.add, local.tee(L.i), local.get(L.M), i32.lt_u, br_if(0)),
      ]),
    ];
  };
  const LOCALS = `bi i j pa pb pEnd aBase bBase cRow ${ACC.map((a) => `${a}:v128`).join(' ')} va0:v128 va1:v128 vb:v128 s01:v128 s23:v128`;
  return withDispatch(m, kps, body, LOCALS);
}

// wide({kps}): like specialised, but 2x6 tiles (12 accumulators, 8 loads per 12 dots instead of
// 6 per 8) over the first N - N % 12 columns, then 2x4 tiles (N is a multiple of 4)
export function wide({ kps }) {
  const m = new Module();
  const acc = accName;
  const ACC = [0, 1].flatMap((r) => [0, 1, 2, 3, 4, 5].map((c) => acc(r, c)));
  const body = (kp) => (L) => {
    const rowB = kp * 2;
    const hsum4 = (...accs) => hsum4Of(L, ...accs);
    const hsum2 = (e, f) => [
      local.get(e), local.get(f), shuffle32([0, 1, 4, 5]), local.get(e), local.get(f), shuffle32([2, 3, 6, 7]), i32x4.add, local.tee(L.s01),
      local.get(L.s01), shuffle32([0, 2, 0, 2]), local.get(L.s01), local.get(L.s01), shuffle32([1, 3, 1, 3]), i32x4.add,
    ];
    const tiles = (cols, jEnd) => {
      const C = [...Array(cols).keys()];
      const kStep = [
        local.get(L.pa), v128.load(0), local.set(L.va0), local.get(L.pa), v128.load(rowB), local.set(L.va1),
        C.map((c) => [local.get(L.pb), v128.load(c * rowB), local.set(L.vb),
          [0, 1].map((r) => [local.get(L[acc(r, c)]), local.get(L[`va${r}`]), local.get(L.vb), i32x4.dot_i16x8_s, i32x4.add, local.set(L[acc(r, c)])])]),
      ];
      const rowOut = (r) => [local.get(L.cRow), local.get(L.N), i32.const(r), i32.mul, local.get(L.j), i32.add, i32.const(2), i32.shl, i32.add];
      return whileStep(L.j, cols, jEnd, [
        [0, 1].flatMap((r) => C.map((c) => [V128_ZERO, local.set(L[acc(r, c)])])),
        local.get(L.aBase), local.get(L.i), i32.const(rowB), i32.mul, i32.add, local.set(L.pa),
        local.get(L.bBase), local.get(L.j), i32.const(rowB), i32.mul, i32.add, local.tee(L.pb), i32.const(rowB), i32.add, local.set(L.pEnd),
        loop(kStep,
          local.get(L.pa), i32.const(16), i32.add, local.set(L.pa),
          local.get(L.pb), i32.const(16), i32.add, local.tee(L.pb), local.get(L.pEnd), i32.lt_u, br_if(0)),
        [0, 1].map((r) => [rowOut(r), hsum4(...[0, 1, 2, 3].map((c) => L[acc(r, c)])), v128.store(),
          cols === 6 ? [rowOut(r), i32.const(16), i32.add, hsum2(L[acc(r, 4)], L[acc(r, 5)]), v128.store64_lane(0)] : []]),
      ]);
    };
    return [
      local.get(L.N), local.get(L.N), i32.const(12), i32.rem_u, i32.sub, local.set(L.j6End),
      forRange(L.bi, L.batch, [
        batchBases(L, rowB, L.cRow),
        i32.const(0), local.set(L.i),
        loop(
          i32.const(0), local.set(L.j),
          tiles(6, L.j6End), tiles(4, L.N),
          local.get(L.cRow), local.get(L.N), i32.const(3), i32.shl, i32.add, local.set(L.cRow),
          local.get(L.i), i32.const(2), i32.add, local.tee(L.i), local.get(L.M), i32.lt_u, br_if(0)),
      ]),
    ];
  };
  const LOCALS = `bi i j j6End pa pb pEnd aBase bBase cRow ${ACC.map((a) => `${a}:v128`).join(' ')} va0:v128 va1:v128 vb:v128 s01:v128 s23:v128`;
  return withDispatch(m, kps, body, LOCALS);
}

// tall({kps, rows}): like specialised, but tiles of `rows` (3 or 4) A rows x 4 B^T rows over the
// first M - M % (2*rows) rows (the rest is whole row pairs, M being even), then 2x4 tiles
export function tall({ kps, rows = 3 }) {
  const m = new Module();
  const acc = accName;
  const RS = [...Array(rows).keys()], CS = [0, 1, 2, 3];
  const body = (kp) => (L) => {
    const rowB = kp * 2;
    const hsum4 = (...accs) => hsum4Of(L, ...accs);
    const tilesOf = (nr, iEnd) => {
      const R = RS.slice(0, nr);
      const kStep = [
        R.map((r) => [local.get(L.pa), v128.load(r * rowB), local.set(L[`va${r}`])]),
        CS.map((c) => [local.get(L.pb), v128.load(c * rowB), local.set(L.vb),
          R.map((r) => [local.get(L[acc(r, c)]), local.get(L[`va${r}`]), local.get(L.vb), i32x4.dot_i16x8_s, i32x4.add, local.set(L[acc(r, c)])])]),
      ];
      const rowOut = (r) => [local.get(L.cBase), local.get(L.i), i32.const(r), i32.add, local.get(L.N), i32.mul, local.get(L.j), i32.add, i32.const(2), i32.shl, i32.add];
      return whileStep(L.i, nr, iEnd, [
        i32.const(0), local.set(L.j),
        loop(
          R.flatMap((r) => CS.map((c) => [V128_ZERO, local.set(L[acc(r, c)])])),
          local.get(L.aBase), local.get(L.i), i32.const(rowB), i32.mul, i32.add, local.set(L.pa),
          local.get(L.bBase), local.get(L.j), i32.const(rowB), i32.mul, i32.add, local.tee(L.pb), i32.const(rowB), i32.add, local.set(L.pEnd),
          loop(kStep,
            local.get(L.pa), i32.const(16), i32.add, local.set(L.pa),
            local.get(L.pb), i32.const(16), i32.add, local.tee(L.pb), local.get(L.pEnd), i32.lt_u, br_if(0)),
          R.map((r) => [rowOut(r), hsum4(...CS.map((c) => L[acc(r, c)])), v128.store()]),
          local.get(L.j), i32.const(4), i32.add, local.tee(L.j), local.get(L.N), i32.lt_u, br_if(0)),
      ]);
    };
    return [
      local.get(L.M), local.get(L.M), i32.const(2 * rows), i32.rem_u, i32.sub, local.set(L.iTallEnd),
      forRange(L.bi, L.batch, [
        batchBases(L, rowB, L.cBase),
        i32.const(0), local.set(L.i),
        tilesOf(rows, L.iTallEnd), tilesOf(2, L.M),
      ]),
    ];
  };
  const LOCALS = `bi i j iTallEnd pa pb pEnd aBase bBase cBase ${RS.flatMap((r) => CS.map((c) => `${acc(r, c)}:v128`)).join(' ')} ${RS.map((r) => `va${r}:v128`).join(' ')} vb:v128 s01:v128 s23:v128`;
  return withDispatch(m, kps, body, LOCALS);
}
