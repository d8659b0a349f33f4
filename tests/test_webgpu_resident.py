"""The resident step's kernels (frontend_js/gpu/resident.js; kernels/res_*.wgsl over
kernels/f64_lib.wgsl + f64_rows.wgsl, docs/VERIFICATION.md §9.2) in a real headless Chromium on
SwiftShader: each equals its JS twin (model.js, optim.js, exchange_codec.js) bit for bit on the
gate's shapes and values (frontend_js/gpu/resident_gates.js); a tiny model's replica resident on the
GPU chains pieces without read-backs (an MLP branch, the whole forward pass, forward and backward)
with the host's bits; a Group trained through the resident step (ResidentTrainer) has the CPU
Group's losses and hashes; and every mutant of the corpus (tests/gpu/mutants.js
RESIDENT_MUTANTS) is rejected by the gate for wrong numbers. Tiny shapes: SwiftShader emulating
float64 is slow. The checks run in tests/pages/resident_selftest.html."""
import pytest

from tests.browser import static_server, webgpu_page

PAGE = "/tests/pages/resident_selftest.html"
CHECKS = ["add", "relu", "reluBack", "adam", "rmsnorm", "rmsnormBackward", "causalSoftmax", "softmaxBackward",
          "crossEntropy", "embeddingBackward", "int8Exchange"]


@pytest.fixture(scope="module")
def selftest():
    with static_server() as base:
        with webgpu_page(base + PAGE, "resident_selftest") as (page, problems):
            page.wait_for_function("window.selftestReady === true", timeout=30_000)

            def run(name, *args, timeout_s=300):
                return page.evaluate(
                    """([name, args, ms]) => Promise.race([window.selftest[name](...args),
                        new Promise((_, reject) => setTimeout(() => reject(new Error(`${name} timed out after ${ms} ms`)), ms))])""",
                    [name, list(args), int(timeout_s * 1000)])
            yield run


@pytest.mark.parametrize("check", CHECKS)
def test_kernel_equals_its_js_twin(selftest, check):
    g = selftest("gate", [check])
    assert g["ok"], g["reason"]                       # names the first mismatch, both values' bits
    assert len(g["cases"]) >= 3, g["cases"]


def test_every_resident_bug_is_rejected_by_the_gate(selftest):
    got = selftest("bugs", timeout_s=500)
    assert len(got) >= 8, got
    missed = [b["name"] for b in got if not b["rejected"]]
    assert not missed, f"bugs the gate let through: {missed}"
    for b in got:
        assert "does not compile" not in b["reason"] and "GPU " in b["reason"], (b["name"], b["reason"])


def test_an_mlp_branch_resident_on_the_gpu_equals_the_host(selftest):
    """rmsnorm -> the unit (fc) -> relu -> the unit (proj) -> residual add in one submit on GPU
    buffers (ResidentKernels + GpuF64Unit.encodeUnit), nothing read back between the pieces."""
    r = selftest("mlpChain", 6, 8)
    assert r["firstBad"] is None and r["flags"] == 0, r
    assert r["n"] == 48, r


def test_the_forward_pass_resident_on_the_gpu_equals_model_js(selftest):
    """Embedding, 2 blocks (attention with split/merged heads, MLP), the head and cross-entropy
    through the resident kernels and the f64 unit on GPU buffers, one submit: the logits and the
    loss in all 64 bits as model.js forward on the host."""
    r = selftest("residentForward", {"width": 16, "seq_len": 16, "batch": 2, "layers": 2, "heads": 2, "steps": 100})
    assert r["firstBad"] is None and not r["nonFinite"], r
    assert r["logits"] == 2 * 16 * 257 and 4 < r["loss"] < 7, r


def test_forward_and_backward_resident_on_the_gpu_equal_loss_and_grads(selftest):
    """The whole local step's computation on the GPU (forward, backward: every gradient, the
    position gradient's tree over the batch, the embedding gradient over repeated tokens) in one
    submit = model.js lossAndGrads in the loss and every gradient's 64 bits."""
    r = selftest("residentGrads", {"width": 16, "seq_len": 16, "batch": 3, "layers": 2, "heads": 2, "steps": 100})
    assert r["firstBad"] is None and not r["nonFinite"], r
    assert r["tensors"] == 2 + 6 * 2 + 2, r


def test_a_group_trained_through_the_resident_step_equals_the_cpu_group(selftest):
    """2 replicas whose steps run on the GPU (ResidentTrainer: forward, backward, Adam resident;
    each slot's int8 exchange message encoded on the GPU, the reduce on the host) = the same Group
    on the CPU: loss and hashes at every step; every GPU message = the host codec's, byte for byte.
    Each Adam starts the next local step on the GPU before the weights are hashed: steps 2-4 of each
    replica are those (3 taken, none dropped); a local step of another slot drops the one started
    and equals the CPU's on the same weights and batch. From the third step on neither trainer
    makes a bind group (each leases from its own kernels: the same buffers and slots every step)."""
    r = selftest("residentGroup", {"width": 16, "seq_len": 16, "batch": 2, "layers": 1, "heads": 2, "steps": 100}, 4, timeout_s=400)
    assert r["firstBad"] is None, r
    assert len(r["hashes"]) == 4 and len(set(r["hashes"])) == 4 and r["cpuSteps"] == [0, 0], r
    assert r["encodedOnGpu"] == 8 and r["messageBad"] is None, r
    assert r["aheadUsed"] == [3, 3] and r["aheadDropped"] == [0, 0], r
    assert r["otherSlotBad"] is None and r["droppedAfter"] == 1, r
    # every unit call of every step self-audited (its samples gathered on the GPU, checked on the host)
    assert r["unitAudits"][0] == r["unitAudits"][1] > 0 and r["unitAudits"][0] % 4 == 0, r
    # each trainer leases from its own kernels (ownKernels, as in a Group): steps 3-4 make no bind group
    assert r["bindGroupsAfterStep2"] == [0, 0], r


def test_the_units_self_audit_catches_a_gpu_gone_bad_and_the_cpu_takes_the_step(selftest):
    """After its gates, replica 0's GPU returns one wrong element in a unit call of every step
    (the last element of the 4th call cleared). The step's self-audit (that element gathered with
    its row and column, recomputed on the host) catches it at the first step: nothing it computed
    is used, the step and every later one are the CPU's, and the Group = the CPU Group at every
    step. (A gather that copied nothing, or a check that compared nothing, passes the fault: this
    test then fails.)"""
    r = selftest("residentAuditCatches", {"width": 16, "seq_len": 16, "batch": 2, "layers": 1, "heads": 2, "steps": 100}, 3, 3, timeout_s=400)
    assert r["firstBad"] is None, r
    assert r["cpuSteps"] == [3, 0], r
    assert r["faults"][1] is None and "the unit's self-audit failed: unit call 4" in (r["faults"][0] or ""), r
