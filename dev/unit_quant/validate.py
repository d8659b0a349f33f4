"""Validate dev/unit_quant's variants in headless Chromium on SwiftShader (the same WGSL and bits
as any GPU): python3 dev/unit_quant/validate.py -> one line per (ROWS, shape), 'equal' or the
first mismatch; exit 1 on any. Not a test of the suite: a dev harness (dev/gemm's style)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.browser import static_server, webgpu_page  # noqa: E402

with static_server() as base:
    with webgpu_page(base + "/dev/unit_quant/validate.html", "unit_quant") as (page, problems):
        page.wait_for_function("window.ready === true", timeout=30_000)
        got = page.evaluate("window.validate()")
bad = [r for r in got if not r["ok"]]
for r in got:
    print(json.dumps(r))
print(f"{len(got) - len(bad)} of {len(got)} equal")
sys.exit(1 if bad else 0)
