"""The INT8 unit wholly on the GPU (frontend_js/gpu/f64.js; float64 emulated with u32 operations
in kernels/f64_lib.wgsl, docs/VERIFICATION.md §9.1) in a real headless Chromium on SwiftShader:
the boot gate passes on both GEMM kernels; every emulated operation equals JS float64 bit for bit
on a randomized sweep with edge cases; the unit equals units.js on random shapes; every variant
of the f64 bug corpus (tests/gpu/mutants.js F64_MUTANTS: patches of today's f64_lib.wgsl and unit kernels) is
rejected by the gate; the GPU engine with
the unit trains the tiny config with the CPU backend's hashes, and a failing gate leaves
today's path; the per-call spot audit catches a result one ULP off and the step is recomputed.
The checks run in tests/pages/f64_selftest.html."""
import pytest

from tests.browser import static_server, webgpu_page

PAGE = "/tests/pages/f64_selftest.html"
BUGS = ["f64_div_no_sticky", "f64_jam_lost", "f64_lost_carry", "f64_mul_no_sticky", "f64_rint_ties_up", "f64_ties_away",
        "f64_truncate", "unit_quant_no_fallback", "unit_quant_rows_mixed", "unit_epilogue_one_slice",
        "gemm_slice_short"]         # tests/gpu/mutants.js F64_MUTANTS, in its order
OPS = {"op mul", "op div", "op add", "op sub", "op sqrt", "op fromI32", "op rintClamp127"}


@pytest.fixture(scope="module")
def selftest():
    """-> run(name, *args, timeout_s=120): calls window.selftest[name](*args) in the page."""
    with static_server() as base:
        with webgpu_page(base + PAGE, "f64_selftest") as (page, problems):
            page.wait_for_function("window.selftestReady === true", timeout=30_000)

            def run(name, *args, timeout_s=120):
                return page.evaluate(
                    """([name, args, ms]) => Promise.race([window.selftest[name](...args),
                        new Promise((_, reject) => setTimeout(() => reject(new Error(`${name} timed out after ${ms} ms`)), ms))])""",
                    [name, list(args), int(timeout_s * 1000)])
            yield run


def test_gate_passes_on_both_gemm_kernels(selftest):
    for g in selftest("gate"):
        assert g["ok"], (g["gemm"], g["reason"])
        names = {c["name"] for c in g["cases"]}
        assert OPS <= names, names
        assert sum(c["n"] for c in g["cases"]) > 20_000, g["gemm"]      # pairs checked
        assert len([n for n in names if n.startswith("unit ")]) >= 10, names


def test_every_operation_equals_js_float64_on_a_random_sweep(selftest):
    cases = selftest("sweep", 4096, 0x0dd5eed)
    assert {c["name"] for c in cases} == OPS
    bad = [f"{c['name']}: {c['reason']}" for c in cases if not c["ok"]]
    assert not bad, bad[0]                                     # names the first mismatch, both values
    assert all(c["n"] >= 4096 for c in cases), [(c["name"], c["n"]) for c in cases]


def test_unit_equals_units_js_on_random_shapes(selftest):
    r = selftest("unitRandom", 0xc0ffee, 40)
    assert r["firstMismatch"] is None, r["firstMismatch"]
    assert r["calls"] == 40 and r["elements"] > 10_000, r


def test_every_f64_bug_is_rejected_by_the_gate(selftest):
    assert len(BUGS) >= 11, BUGS
    got = selftest("bugs", timeout_s=240)
    assert [b["name"] for b in got] == BUGS
    missed = [b["name"] for b in got if not b["rejected"]]
    assert not missed, f"bugs the gate let through: {missed}"
    for b in got:                                  # rejected for wrong numbers, not for not compiling
        assert "does not compile" not in b["reason"] and "GPU " in b["reason"], (b["name"], b["reason"])


def test_engine_trains_with_the_unit_and_a_failing_gate_leaves_todays_path(selftest):
    r = selftest("engine", 2, timeout_s=240)
    forced = r["forced"]
    assert forced["path"] == "gpu" and forced["unit"].startswith("f64 unit on"), forced
    assert forced["firstBadStep"] is None, forced["firstBadStep"]
    assert forced["stats"]["unitCalls"] > 0 and forced["stats"]["spotAudits"] == forced["stats"]["unitCalls"], forced["stats"]
    bad = r["bad library"]
    assert bad["path"] == "gpu" and bad["unit"] == "f64 unit off", bad
    assert any("f64 unit disabled" in x and "GPU " in x for x in bad["reasons"]), bad["reasons"]
    assert bad["stats"]["unitCalls"] == 0 and bad["stats"]["gpuCalls"] > 0 and bad["firstBadStep"] is None, bad
    default = r["default"]                         # SwiftShader: a software adapter keeps it off
    assert default["unit"].startswith("f64 unit off: a software adapter"), default
    assert default["stats"]["unitCalls"] == 0 and default["firstBadStep"] is None, default


def test_spot_audit_catches_a_wrong_result_and_the_step_is_recomputed(selftest):
    r = selftest("audit", timeout_s=120)
    assert r["path"] == "cpu", r                   # the engine dropped the GPU for good
    caught = [x for x in r["reasons"] if "f64 unit failed an audit on call 3" in x]
    assert caught and "spot audit: batch 0 row 0 col 0" in caught[0], r["reasons"]
    assert r["hashesEqual"], r                     # the recomputed step = the CPU backend's
