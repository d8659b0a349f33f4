// The GPU engine's routing rules (frontend_js/gpu/route.js), pure functions, no GPU: which
// fused-unit calls go to the GPU for each route option and adapter, and the rule in words.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { ROUTE, gpuPays, routeRule, ruleForAdapter, routeToGpu, describeRoute } from '../../frontend_js/gpu/route.js';

test('route all: every call on the GPU; route auto: only where gpuPays', () => {
  assert.equal(routeRule({}), null);
  assert.equal(routeRule({ route: 'all', routeRule: { minK: 1 } }), null, 'a rule without route auto is ignored');
  assert.deepEqual(routeRule({ route: 'auto' }), ROUTE);
  assert.deepEqual(routeRule({ route: 'auto', routeRule: { minMacs: 8 } }), { minK: ROUTE.minK, minMacs: 8 });
  assert.equal(routeToGpu(null, 1, 1, 1, 1), true);
  const big = [1, 64, 64, ROUTE.minMacs / (64 * 64)];             // exactly minMacs, K = 64
  assert.equal(gpuPays(...big), true);
  assert.equal(routeToGpu(ROUTE, ...big), true);
  assert.equal(routeToGpu(ROUTE, big[0], big[1], big[2], big[3] - 1), false, 'one multiply-add column short');
  assert.equal(routeToGpu(ROUTE, 1, 2 ** 20, ROUTE.minK - 1, 2 ** 20), false, 'K below minK, however large');
});

test('a software adapter gets nothing on the GPU unless the rule was given; the rule in words', () => {
  const soft = { isFallbackAdapter: true }, hard = { isFallbackAdapter: false };
  assert.equal(ruleForAdapter(ROUTE, soft, undefined).minMacs, Infinity);
  assert.equal(routeToGpu(ruleForAdapter(ROUTE, soft, undefined), 1, 4096, 4096, 4096), false);
  assert.equal(ruleForAdapter(ROUTE, hard, undefined), ROUTE);
  const given = { minK: 1, minMacs: 1 };
  assert.equal(ruleForAdapter(given, soft, given), given, 'an explicit routeRule (tests) is used as given');
  assert.equal(ruleForAdapter(null, soft, undefined), null, 'route all stays all');
  assert.equal(describeRoute(null), 'every GEMM on the GPU');
  assert.match(describeRoute(ruleForAdapter(ROUTE, soft, undefined)), /every GEMM on the CPU: a software adapter/);
  assert.equal(describeRoute(ROUTE), `GEMMs with K >= 32 and >= ${2 ** 22} multiply-adds on the GPU, the rest on the CPU (faster for small ones)`);
});
