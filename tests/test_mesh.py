"""Group runs between real pages: `python app.py` on 127.0.0.1, headless Chromium pages that
link over WebRTC (loopback) and train one model together. Every page's hash must equal every
other's at every step, and equal `python -m daisy.train --peers P` with the same settings.

Each test opens its own pages and closes them at the end (a closed page says goodbye, so the
next test's group holds only its own pages); a test that needs isolation uses a room.
"""
from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import pytest

from tests import reference
from tests.reference import reference_hashes as reference_run, setting_args, train_hashes
from tests.app_server import WAIT_MS, offline_app, open_peer, running_app, state, wait_state

pytestmark = pytest.mark.slow

RUN_MS = 120_000            # bound on a whole test run in the pages
TINY = {"width": 16, "seq_len": 16, "batch": 2, "layers": 1, "heads": 4}
EXPECTED_CONSOLE = ("a test fault",)   # the GPU engine says so loudly when a test faults it


@pytest.fixture(scope="module")
def app_url():
    with offline_app("mesh") as base:
        yield base


# ---- helpers --------------------------------------------------------------------------------

def reference_hashes(peers: int, settings: dict, steps: int) -> list[str]:
    """python -m daisy.train --peers P with these settings: the hash after each of `steps` steps."""
    return reference.reference_hashes(settings, steps, peers=peers)


def record_steps(page) -> None:
    """window.stepHashes {step: hash}: the last computation of each step; a step undone (a Stop
    that landed while this page applied the step past it, a rollback) leaves it."""
    page.evaluate("""() => { window.stepHashes = {}; window.runEnded = null;
        window.daisy.on('step', (e) => { window.stepHashes[e.step] = e.hash; });
        window.daisy.on('step-undone', (e) => { for (const k of Object.keys(window.stepHashes)) if (Number(k) > e.step) delete window.stepHashes[k]; });
        window.daisy.on('run-ended', (e) => { window.runEnded = e; }); }""")


def step_hashes(page) -> dict[int, str]:
    return {int(k): v for k, v in page.evaluate("window.stepHashes").items()}


def assert_hashes_equal(label: str, got: dict[int, str], want: list[str], first: int = 1) -> None:
    """got {step: hash} must hold want[0] at `first`, want[1] at first+1, ... exactly."""
    assert sorted(got) == list(range(first, first + len(want))), f"{label}: steps {sorted(got)[:5]}..{sorted(got)[-5:]}"
    for i, h in enumerate(want):
        step = first + i
        assert got[step] == h, f"{label}: first mismatch at step {step}: page {got[step]}, reference {h}"


def set_setting(page, name: str, value: int) -> None:
    box = page.locator(f"#setting-{name} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_function(f"+document.querySelector('#setting-{name} input[type=range]').value === {value}",
                           timeout=WAIT_MS)


def linked(page, others) -> None:
    ids = [state(o)["peerId"] for o in others]
    wait_state(page, " && ".join(f"s.links[{json.dumps(i)}] === 'linked'" for i in ids) or "true",
               f"links to {ids}", timeout_ms=20_000)


def accept(host, guest) -> str:
    """The room host clicks Accept on `guest`'s request -> the guest's peer id."""
    gid = state(guest)["peerId"]
    host.wait_for_selector(f'#daisy-peer button.accept[data-peer="{gid}"]', timeout=WAIT_MS)
    host.click(f'#daisy-peer button.accept[data-peer="{gid}"]')
    return gid


def room_pair(pages, url: str) -> tuple:
    """A room's host and the guest it accepted, linked -> (host, guest)."""
    host, guest = open_peer(pages, url, "host"), open_peer(pages, url, "guest")
    accept(host, guest)
    linked(guest, [host])
    return host, guest


def open_group(pages, url: str, n: int, label: str = "p", init_script: str | None = None) -> list:
    group = [open_peer(pages, url, f"{label}{i}", init_script) for i in range(n)]
    for page in group:
        linked(page, [o for o in group if o is not page])
        record_steps(page)
    return group


def ended(page, what: str, timeout_ms: int = RUN_MS) -> dict:
    wait_state(page, "!s.running && ['done', 'stopped', 'failed'].includes(s.runState)", what, timeout_ms)
    return state(page)


def test_a_lost_offer_is_offered_again(app_url, pages):
    # each page loses the first offer it sends: without the offering side's watchdog
    # (peer.js LINK_READY_MS) the link would stay 'connecting' for good
    lose = "window.__daisyTest = {loseFirstOffer: true};"
    url = f"{app_url}/?room=lost-offer-{secrets.token_hex(6)}"
    a = open_peer(pages, url, "lost-a", init_script=lose)
    b = open_peer(pages, url, "lost-b", init_script=lose)
    b_id = accept(a, b)
    linked(a, [b])
    linked(b, [a])
    assert state(a)["links"][b_id] == "linked"


# ---- the group trains ---------------------------------------------------------------------

def test_two_pages_train_the_run_of_the_reference(app_url, pages):
    a, b = open_group(pages, app_url + "/", 2)
    set_setting(b, "steps", 100)
    b.get_by_role("button", name="Start training", exact=True).click()    # b leads; a joins
    sa, sb = ended(a, "a finished"), ended(b, "b finished")
    for s in (sa, sb):
        assert s["runState"] == "done" and s["step"] == 100, s["message"]
        assert s["run"]["roster"] == [sb["peerId"], sa["peerId"]] and s["run"]["leader"] == sb["peerId"], s["run"]
        assert s["replicas"] == {"count": 2, "agree": True, "agreeing": 2, "step": 100}, s["replicas"]
    want = reference_hashes(2, {"steps": 100}, 100)
    assert_hashes_equal("leader", step_hashes(b), want)
    assert_hashes_equal("member", step_hashes(a), want)
    # the panel's peer table shows each peer's hash
    for page, other in ((a, sb), (b, sa)):
        row = page.inner_text(f'#daisy-peer tr[data-peer="{other["peerId"]}"]')
        assert want[-1][:16] in row and "linked" in row, row
    assert "2 of 2 replicas agree at step 100" in a.inner_text("#daisy-peer")
    # every owed audit ran before FIN; the default chance 0.1 says how soon a liar is caught
    assert "gradients audited through step 100 (one liar is caught within ~10 steps)" in a.inner_text("#daisy-peer")
    # the user's question: the group against this device alone (frontend_js/run/speed.js), from
    # the same step times the tokens/s readout shows and this page's own compute per step
    for page, s in ((a, sa), (b, sb)):
        sp = s["speed"]
        assert sp["tokensPerS"] == s["tokensPerS"] and sp["aloneTokensPerS"] > 0 and sp["ratio"] > 0, sp
        assert abs(sp["ratio"] - sp["tokensPerS"] / sp["aloneTokensPerS"]) <= 1e-9 * sp["ratio"], sp
        line = page.inner_text('#daisy-peer [data-role="speedup"]')
        m = re.fullmatch(r"this group trains ([0-9.]+)× as fast as this device alone \(([0-9,]+) tokens/s alone\)"
                         r"(; the exchange adds [0-9]+ % to each step here: local steps [0-9]+ would hide it)?", line)
        assert m and abs(float(m.group(1)) - sp["ratio"]) <= 0.051 * max(1.0, sp["ratio"]), (line, sp)


def test_two_pages_train_local_steps_equal_to_the_reference(app_url, pages):
    """Local steps (H 4; docs/VERIFICATION.md "Local steps") in two pages, their rounds audited at the
    default rate (§13 "Rounds of local steps"): every step's hash (the group's anchor) = python -m
    daisy.train --local-steps 4, to the run's end, and the panel says how soon a liar is caught."""
    a, b = open_group(pages, app_url + "/", 2)
    for page in (a, b):
        record_steps(page)
    settings = {"steps": 100, "local_steps": 4, **TINY}
    a.evaluate("(cfg) => window.daisy.start(cfg)", settings)         # audits of rounds at the default rate
    sa, sb = ended(a, "a finished"), ended(b, "b finished")
    for s in (sa, sb):
        assert s["runState"] == "done" and s["step"] == 100, s["message"]
    want = reference_hashes(2, settings, 100)
    assert_hashes_equal("leader", step_hashes(a), want)
    assert_hashes_equal("member", step_hashes(b), want)
    # every owed audit of a round ran before FIN; rounds of 4 at the default chance 0.1: ~40 steps
    assert "rounds audited through step 100 (one liar is caught within ~40 steps)" in a.inner_text("#daisy-peer")


def test_three_pages_stop_together_and_equal_the_reference(app_url, pages):
    group = open_group(pages, app_url + "/", 3)
    a, b, c = group
    settings = {"steps": 1000, **TINY}
    c.evaluate("(cfg) => window.daisy.start(cfg)", settings)
    for page in group:
        wait_state(page, "s.running && s.step >= 30", "30 steps", RUN_MS)
    b.get_by_role("button", name="Stop", exact=True).click()          # a member stops the group
    finals = [ended(page, "stopped") for page in group]
    steps = {s["step"] for s in finals}
    assert len(steps) == 1, f"pages stopped at different steps: {[s['step'] for s in finals]}"
    k = steps.pop()
    assert k >= 30 and all(s["runState"] == "stopped" for s in finals), [s["message"] for s in finals]
    assert len({s["hash"] for s in finals}) == 1
    assert finals[0]["run"]["topology"] == "allgather" and len(finals[0]["run"]["roster"]) == 3
    want = reference_hashes(3, settings, k)
    for page, label in zip(group, "abc"):
        assert_hashes_equal(label, step_hashes(page), want)


def test_room_host_and_approved_guest_train_and_the_pending_one_gets_nothing(app_url, pages):
    url = f"{app_url}/?room=mesh-{secrets.token_hex(6)}"
    host = open_peer(pages, url, "host")
    guest = open_peer(pages, url, "guest")
    accept(host, guest)
    wait_state(guest, "s.role === 'member'", "guest approved")
    linked(guest, [host])
    waiting = open_peer(pages, url, "waiting")                         # never approved
    wid = state(waiting)["peerId"]
    host.wait_for_selector(f'#daisy-peer button.accept[data-peer="{wid}"]', timeout=WAIT_MS)
    err = waiting.evaluate("(cfg) => window.daisy.start(cfg).then(() => 'started', (e) => e.message)", TINY)
    assert "waiting for the room host" in err, err
    for page in (host, guest):
        record_steps(page)
    settings = {"steps": 1000, **TINY}
    guest.evaluate("(cfg) => window.daisy.start(cfg)", settings)       # an approved member may start
    wait_state(host, "s.running && s.step >= 10", "host trains", RUN_MS)
    host.evaluate("window.daisy.stop()")
    sh, sg = ended(host, "host stopped"), ended(guest, "guest stopped")
    assert sh["run"]["roster"] == [sg["peerId"], sh["peerId"]], sh["run"]
    assert sh["step"] == sg["step"] and sh["hash"] == sg["hash"]
    want = reference_hashes(2, settings, sh["step"])
    assert_hashes_equal("host", step_hashes(host), want)
    sw = state(waiting)
    assert sw["role"] == "pending" and sw["run"] is None and sw["step"] == 0 and sw["links"] == {}, sw
    assert [p["id"] for p in sw["peers"]] == [wid], "the pending page learned about the room"


def test_a_webgpu_page_and_a_cpu_page_train_together(app_url, pages):
    gpu = open_peer(pages, app_url + "/?gpu=all", "gpu")
    cpu = open_peer(pages, app_url + "/?gpu=off", "cpu")
    wait_state(gpu, "s.path !== null", "gpu page path")
    wait_state(cpu, "s.path !== null", "cpu page path")
    sg, sc = state(gpu), state(cpu)
    assert sg["path"] == "gpu" and "every GEMM" in sg["engine"], (sg["path"], sg["engine"], sg["pathReason"])
    # the CPU page's engine: wasm-simd, on every core when the page is isolated (threads.js)
    cores = min(cpu.evaluate("navigator.hardwareConcurrency"), 16)
    want_engine = f"wasm-simd × {cores} threads" if cores > 1 else "wasm-simd"
    assert sc["path"] == "cpu" and sc["engine"] == want_engine, (sc["path"], sc["engine"], want_engine)
    linked(gpu, [cpu])
    for page in (gpu, cpu):
        record_steps(page)
    settings = {"steps": 100, **TINY}
    cpu.evaluate("(cfg) => window.daisy.start(cfg)", settings)
    wait_state(cpu, "s.running && s.step >= 30", "30 steps", RUN_MS)
    assert state(cpu)["tokensPerS"] > 0, "the CPU page reports no speed"
    cpu.evaluate("window.daisy.stop()")
    s1, s2 = ended(gpu, "gpu stopped"), ended(cpu, "cpu stopped")
    assert s1["step"] == s2["step"] >= 30 and s1["hash"] == s2["hash"]
    want = reference_hashes(2, settings, s1["step"])
    assert_hashes_equal("gpu page", step_hashes(gpu), want)
    assert_hashes_equal("cpu page", step_hashes(cpu), want)
    # a GPU fault: the page's compute line and every peer's table say CPU alike (announce)
    gid = sg["peerId"]
    gpu.evaluate("window.daisy.testing.faultGpu('a test fault')")
    wait_state(gpu, "s.path === 'cpu' && s.pathLabel.includes('GPU disabled after a fault')", "gpu page on the CPU")
    wait_state(cpu, f"s.peers.some((p) => p.id === '{gid}' && p.path === 'cpu')", "the cpu page's table says cpu")


def test_another_mesh_protocol_is_refused_on_both_pages(app_url, pages):
    frames_js = (Path(__file__).resolve().parents[1] / "frontend_js" / "mesh" / "frames.js").read_text()
    v = int(re.search(r"export const PROTOCOL_VERSION = (\d+);", frames_js).group(1))     # this version
    new = open_peer(pages, app_url + "/", f"v{v}")
    old = open_peer(pages, app_url + f"/?meshProtocol={v - 1}", f"v{v - 1}")   # a page of the version before
    new_id, old_id = state(new)["peerId"], state(old)["peerId"]
    wait_state(new, f"(s.links[{json.dumps(old_id)}] || '').startsWith('refused')", "the new page refuses the old", 20_000)
    wait_state(old, f"(s.links[{json.dumps(new_id)}] || '').startsWith('refused')", "the old page refuses the new", 20_000)
    assert f"protocol v{v - 1}, this page v{v}" in state(new)["links"][old_id]
    assert f"v{v}" in state(old)["links"][new_id]
    new.wait_for_function(f"document.querySelector('#daisy-peer').innerText.includes('protocol v{v - 1}')", timeout=WAIT_MS)
    # a Start leaves the incompatible page out: a one-peer run
    new.evaluate("(cfg) => window.daisy.start(cfg)", {"steps": 100, **TINY})
    wait_state(new, "s.running && s.step >= 2", "solo run")
    assert state(new)["run"]["roster"] == [new_id]
    assert state(old)["run"] is None
    new.evaluate("window.daisy.stop()")
    ended(new, "stopped")


# ---- faults ---------------------------------------------------------------------------------

BAD_FRAMES_JS = """async ([to, runId, slot, gradBytes]) => {
  const f = await window.daisy.mesh.frames();
  // a step the receiver has in flight: the sender's own (0-based) step or the next one (the
  // receiver is at most one step from the sender); the wrong-length frame goes out for both
  const step = window.daisy.state().step;
  const send = (bytes) => window.daisy.mesh.sendRaw(to, bytes);
  const grad = (fields, n = gradBytes) => f.encodeMessage({ type: f.TYPES.GRAD, slot, runId, step, payload: new Uint8Array(n), ...fields }, 0x7fff0000 + Math.floor(Math.random() * 1e6), 256 * 1024);
  const sent = [];
  for (let i = 0; i < 60; i++) await send(new Uint8Array(80).fill(i));          sent.push('flood');
  await send(new Uint8Array([1, 2, 3, 4, 5]));                                   sent.push('truncated');
  await send(new Uint8Array(200).fill(0x41));                                    sent.push('bad magic');
  // another run (run id + 1 would be this run's next epoch: the split alarm, tests/js/run.test.mjs)
  for (const c of await grad({ runId: (runId + 100000) >>> 0 })) await send(c); sent.push('wrong run id');
  for (const c of await grad({ step: step + 50 })) await send(c);               sent.push('wrong step');
  for (const c of await grad({ slot: slot + 7 })) await send(c);                 sent.push('wrong slot');
  const [one] = await grad({ step: step + 50 }, 16);
  one[70] ^= 0xff;
  await send(one);                                                               sent.push('bad digest');
  const big = (await grad({}, 16))[0];
  new DataView(big.buffer).setUint32(24, 0xffffffff, true);
  await send(big);                                                               sent.push('huge length');
  return sent;
}"""


def test_bad_frames_are_dropped_and_the_run_goes_on(app_url, pages):
    a, b = open_group(pages, app_url + "/", 2)
    settings = {"steps": 1000, **TINY}
    a.evaluate("(cfg) => window.daisy.start(cfg)", settings)
    wait_state(b, "s.running && s.step >= 5", "training")
    # one run per group: a second Start anywhere is refused with the reason
    err = b.evaluate("(cfg) => window.daisy.start(cfg).then(() => 'started', (e) => e.message)", TINY)
    assert "already going" in err, err
    sa = state(a)
    # GRAD frames of 840 payload bytes: far from the run's real size (every other check is met)
    sent = b.evaluate(BAD_FRAMES_JS, [sa["peerId"], sa["run"]["id"], 1, 32 + 8 + 8 * 100])
    assert len(sent) == 8, sent
    # an outsider (linked, not in the roster: it never asks to join, or a fast join could admit
    # it before its frames go out) sends a frame of the run: dropped too
    c = open_peer(pages, app_url + "/", "outsider", init_script="window.__daisyTest = {noJoin: true};")
    linked(c, [a])
    c.evaluate(BAD_FRAMES_JS.replace("for (let i = 0; i < 60", "for (let i = 0; i < 0"),
               [sa["peerId"], sa["run"]["id"], 0, 32 + 8])
    step_then = state(a)["step"]
    wait_state(a, f"s.running && s.step >= {step_then + 10}", "the run goes on after the bad frames", RUN_MS)
    drops = a.evaluate("window.daisy.mesh.drops()")
    reasons = "\n".join(drops["recent"])
    for needle in ("truncated frame", "bad magic", "not a run or epoch of this device", "not in flight", "claimed by the peer of slot",
                   "digest mismatch", "over its limit", "not in the run's roster"):
        assert needle in reasons, f"no drop for {needle!r} in:\n{reasons}"
    assert drops["count"] >= 60 + 7
    a.evaluate("window.daisy.stop()")
    s1, s2 = ended(a, "a stopped"), ended(b, "b stopped")
    assert s1["step"] == s2["step"] and s1["hash"] == s2["hash"]
    schedule = ",".join(f"{f}:{n}" for f, n in s1["run"]["history"])      # "0:2" or "0:2,k:3"
    want = reference_run({"steps": 1000, **TINY}, s1["step"], roster=schedule)
    assert_hashes_equal("a", step_hashes(a), want)


def test_a_member_that_sends_a_gradient_of_the_wrong_size_is_removed(app_url, pages):
    """A GRAD of the run's step in flight from a member, of the wrong length, is evidence by itself
    (the cheap check, docs/PROTOCOL.md "Audited gradients"): the receiver removes its sender, goes
    back to the sender's last passed audit and trains on alone, on the reference of that history."""
    a, b = open_group(pages, app_url + "/", 2)
    a.evaluate("(cfg) => window.daisy.start(cfg)", {"steps": 1000, **TINY})
    wait_state(b, "s.running && s.step >= 5", "training")
    sa = state(a)
    b.evaluate("""async ([to, runId]) => {
      const f = await window.daisy.mesh.frames();
      const step = window.daisy.state().step;
      for (const s of [step, step + 1]) {
        for (const c of await f.encodeMessage({ type: f.TYPES.GRAD, slot: 1, runId, step: s, payload: new Uint8Array(64) }, 0x7ff00000 + s, 256 * 1024)) {
          await window.daisy.mesh.sendRaw(to, c);
        }
      }
    }""", [sa["peerId"], sa["run"]["id"]])
    wait_state(a, f"s.running && s.run.roster.length === 1 && s.step >= {sa['step'] + 5}", "a trains on alone", RUN_MS)
    notes = "\n".join(state(a)["notes"])
    assert f"gradient from" in notes and "bytes where" in notes and "removed" in notes, notes
    a.evaluate("window.daisy.stop()")
    s1 = ended(a, "a stopped")
    schedule = ",".join(f"{f}:{n}" for f, n in s1["run"]["history"])      # "0:2,k:1"
    assert s1["run"]["history"][-1][1] == 1, s1["run"]["history"]
    assert_hashes_equal("a", step_hashes(a), reference_run({"steps": 1000, **TINY}, s1["step"], roster=schedule))


def test_a_diverged_replica_stops_every_page(app_url, pages):
    a, b = open_group(pages, app_url + "/", 2)
    a.evaluate("(cfg) => window.daisy.start(cfg)", {"steps": 1000, **TINY})
    wait_state(b, "s.running && s.step >= 3", "training")
    b.evaluate("window.daisy.corruptWeights()")
    sa, sb = ended(a, "a stopped", 20_000), ended(b, "b stopped", 20_000)
    for s in (sa, sb):
        assert s["runState"] == "stopped" and s["error"] == "replica mismatch", s["message"]
        assert "disagree" in s["message"] and "never fork" in s["message"], s["message"]
    assert sb["peerId"] in sa["message"] and sa["peerId"] in sb["message"], (sa["message"], sb["message"])


# Departures (closed, crashed, frozen pages, the leader leaving) are tests/test_membership.py.


# ---- FineWeb-Edu keyed batches through a slow Hub -------------------------------------------

def test_two_pages_on_fineweb_through_a_slow_hub_equal_the_cli(tmp_path, browser):
    """The test hub (tests/testhub.py) answers every request 100 ms late; the pages' batches
    come from /data/batch (prefetched), and the run equals `daisy.train --data-url`."""
    import os
    from tests.testhub import TestHub, shard_path, write_fineweb_shard
    files = {}
    for i, (n_rg, rows) in enumerate([(3, 60), (2, 50)]):
        local = os.path.join(tmp_path, f"shard{i}.parquet")
        write_fineweb_shard(local, n_rg, rows, seed=i + 31)
        files[shard_path(i)] = open(local, "rb").read()
    hub = TestHub(files, delay_s=0.1)
    hub.start()
    browser.problems.clear()
    try:
        with running_app(str(tmp_path), "fineweb", {"HF_ENDPOINT": hub.endpoint, "DAISY_ICE_SERVERS": "[]"}) as base:
            host, guest = room_pair(browser, f"{base}/?room=fw-{secrets.token_hex(6)}")
            for page in (host, guest):
                record_steps(page)
            wait_state(host, "s.dataSource && s.dataSource.source === 'fineweb-edu'", "FineWeb-Edu served")
            settings = {"steps": 100, **TINY}
            host.evaluate("(cfg) => window.daisy.start(cfg)", settings)
            wait_state(host, "s.running && s.step >= 30", "30 steps on FineWeb-Edu", RUN_MS)
            host.evaluate("window.daisy.stop()")
            sh, sg = ended(host, "host stopped"), ended(guest, "guest stopped")
            k = sh["step"]
            assert sg["step"] == k and sg["hash"] == sh["hash"]
            stats = host.evaluate("window.daisy.mesh.stats()")
            want = train_hashes("--peers", "2", "--data-url", base, "--stop-after", str(k),
                                *setting_args(settings))
            assert_hashes_equal("host", step_hashes(host), want)
            assert_hashes_equal("guest", step_hashes(guest), want)
            # prefetch keeps the data off the step's path: well under the hub's 100 ms per step
            assert stats["dataWaitMs"] / k < 50, stats
    finally:
        hub.stop()
        problems = list(browser.problems)
        browser.close_pages()
    assert not problems, "console errors:\n" + "\n".join(problems)
