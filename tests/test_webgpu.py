"""The WGSL path in a real headless Chromium (SwiftShader adapter, docs/ARCHITECTURE.md "Browser
tests") on a page served from 127.0.0.1: boot gates on both kernels, the bug corpus fully
rejected with 0 false alarms, the B2B chain bit-identical to its CPU mirror, an audit catching
a kernel that goes bad mid-run, device loss and other faults falling back to CPU without losing
the step, and 20 training steps on the GPU path giving the reference's hashes. The checks run in tests/pages/gpu_selftest.html."""
import subprocess
import sys

import pytest

from tests.browser import static_server, webgpu_page

PAGE = "/tests/pages/gpu_selftest.html"
BUG_IDS = {"sign_extension", "unsigned_dot", "ragged_edge", "missing_barrier", "int16_saturation",
           "f32_accumulate", "fma_accumulate", "subnormal_flush", "k_off_by_one", "byte_order_pack",
           "bad_after_n"}


@pytest.fixture(scope="module")
def fixtures_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("fixtures")
    subprocess.run([sys.executable, "-m", "daisy.fixtures", str(out)], check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def selftest(fixtures_dir):
    """-> run(name, *args, timeout_s=60): calls window.selftest[name](*args) in the page."""
    with static_server(extra={"/fixtures/": fixtures_dir}) as base:
        with webgpu_page(base + PAGE, "gpu_selftest") as (page, problems):
            page.wait_for_function("window.selftestReady === true", timeout=30_000)

            def run(name, *args, timeout_s=60):
                return page.evaluate(
                    """([name, args, ms]) => Promise.race([window.selftest[name](...args),
                        new Promise((_, reject) => setTimeout(() => reject(new Error(`${name} timed out after ${ms} ms`)), ms))])""",
                    [name, list(args), int(timeout_s * 1000)])
            run.problems = problems
            yield run


TRAIN20 = "/fixtures/train20.dsyf"


def test_webgpu_adapter_is_swiftshader(selftest):
    r = selftest("adapter")
    assert r["hasGpu"], "navigator.gpu is missing: WebGPU must not silently be absent (flag --enable-unsafe-webgpu)"
    info = r["info"]
    assert r["secure"] is True
    assert "swiftshader" in (str(info["vendor"]) + str(info["architecture"]) + str(info["description"])).lower(), info
    assert info["isFallbackAdapter"] is True, info
    assert "packed_4x8_integer_dot_product" in info["wgslLanguageFeatures"], info["wgslLanguageFeatures"]


def test_gates_pass_on_both_kernels(selftest):
    r = selftest("gates")
    by_id = {s["id"]: s for s in r["single"]}
    assert set(by_id) == {"packed", "portable"}
    for kid, s in by_id.items():
        assert s["path"] == "gpu" and s["kernel"] == kid, f"{kid}: {s['reasons']}"
        failed = [c["name"] for c in s["cases"] if not c["ok"]]
        assert not failed and len(s["cases"]) >= 15, (kid, failed, len(s["cases"]))
    assert r["boot"]["kernel"] == "packed" and r["boot"]["name"] == "webgpu-packed", r["boot"]
    assert r["shown"] == "gpu (packed kernel)"


def test_bug_corpus_fully_rejected_and_no_false_alarms(selftest):
    r = selftest("bugs", timeout_s=90)
    got = {b["id"]: b for b in r["bugs"]}
    assert set(got) == BUG_IDS
    missed = {k: (b["caughtBy"], b["reason"]) for k, b in got.items() if b["caughtBy"] not in ("gate", "audit")}
    assert not missed, f"bugs not rejected by a gate or an audit: {missed}"
    for k, b in got.items():                       # a rejection must be for wrong numbers
        assert "does not compile" not in b["reason"], (k, b["reason"])
    assert got["bad_after_n"]["caughtBy"] == "audit" and got["bad_after_n"]["calls"] > 0, got["bad_after_n"]
    tile_only = r["tileOnly"][0]                   # the tile audit alone also catches it
    assert tile_only["caughtBy"] == "audit" and "tile audit" in tile_only["reason"], tile_only
    real = {b["id"]: b for b in r["real"]}
    assert set(real) == {"packed", "portable"}
    for k, b in real.items():
        assert b["caughtBy"] is None and b["calls"] == 24, f"false alarm on the real {k} kernel: {b['reason']}"


def test_b2b_chain_matches_cpu_chain(selftest):
    r = selftest("b2b")
    assert r["kernel"] == "packed"
    assert r["accMismatch"] is None, f"last-layer int32 differs: {r['accMismatch']}"
    assert r["qMismatch"] is None, f"last-layer int8 differs: {r['qMismatch']}"
    # the chain exercised rounding, both clamps and the ReLU zeros
    assert r["saturated"] > 0 and r["zeros"] > 0 and r["distinct"] > 50, r


def test_audit_catches_kernel_going_bad_mid_run(selftest):
    r = selftest("auditMidRun", TRAIN20, 4, timeout_s=60)
    assert r["bootPath"] == "gpu", r["reasons"]
    assert r["path"] == "cpu" and r["faults"] == ["audit"], r
    assert any("failed an audit" in x for x in r["reasons"]), r["reasons"]
    assert r["stats"]["gpuCalls"] > 0 and r["stats"]["cpuCalls"] > 0, r["stats"]
    bad = [s for s in r["steps"] if not s["ok"]]
    assert not bad, f"steps whose hashes differ from the reference after the fault: {bad}"
    assert "failed an audit" in r["shown"], "the reason must be shown in the page"


def test_device_loss_mid_step_falls_back_to_cpu(selftest):
    r = selftest("deviceLoss", TRAIN20, timeout_s=60)
    assert r["bootPath"] == "gpu"
    assert r["path"] == "cpu" and any("device lost" in x for x in r["reasons"]), r["reasons"]
    assert r["stats"]["gpuCalls"] > 0 and r["stats"]["cpuCalls"] > 0, r["stats"]
    assert all(s["ok"] for s in r["steps"]), f"a step was lost or corrupted: {r['steps']}"
    assert r["shown"] == "cpu"


def test_compile_error_missing_kernel_and_uncaptured_error_fall_back(selftest):
    r = selftest("faults")
    assert r["compile"]["path"] == "cpu" and any("does not compile" in x for x in r["compile"]["reasons"]), r["compile"]
    assert r["missing"]["path"] == "cpu" and any("HTTP 404" in x for x in r["missing"]["reasons"]), r["missing"]
    u = r["uncaptured"]
    assert u["before"] == "gpu" and u["path"] == "cpu", u
    assert any("uncaptured GPU error" in x for x in u["reasons"]), u["reasons"]
    assert u["mismatch"] is None, f"the call after the fault must still be exact: {u['mismatch']}"


def test_train20_on_gpu_path_matches_reference_hashes(selftest):
    r = selftest("train20", TRAIN20, timeout_s=100)
    assert r["path"] == "gpu" and r["kernel"] == "packed", r["reasons"]
    assert r["steps"] == 20
    assert r["allOk"], f"first step off the reference: {r['first']}"
    assert r["stats"]["cpuCalls"] == 0 and r["stats"]["gpuCalls"] > 0 and r["stats"]["tileAudits"] > 0, r["stats"]


def test_train20_with_calls_routed_between_gpu_and_cpu_matches_reference_hashes(selftest):
    # route 'auto' with a K rule only: the K >= 64 GEMMs on the GPU, the rest on the CPU engine
    r = selftest("train20", TRAIN20, "auto", {"minK": 64, "minMacs": 0}, timeout_s=100)
    assert r["path"] == "gpu", r["reasons"]
    assert r["allOk"], f"first step off the reference: {r['first']}"
    st = r["stats"]
    assert st["gpuCalls"] > 0 and st["routed"] > 0 and st["cpuCalls"] == 0, st
