"""Restoring the group from one checkpoint (docs/ARCHITECTURE.md "Group restore"): real pages of
`python app.py` linked over WebRTC. A `.pt` loaded on one page goes to every other page
(GROUP_STATE); all show its hash, and Start on another page resumes the run for the whole group,
every step equal to `python -m daisy.train --resume FILE --peers P`. Hostile or untimely
GROUP_STATE messages (sent raw from a page, bytes made by Python) are refused and change nothing.
"""
from __future__ import annotations

import base64
import json

import pytest

from daisy.files.checkpoint import load_checkpoint
from daisy.files.state_codec import encode_state
from tests.app_server import offline_app, state, wait_state
from tests.reference import setting_args, train_hashes, train_json
from tests.test_mesh import RUN_MS, TINY, assert_hashes_equal, ended, open_group, step_hashes

pytestmark = pytest.mark.slow

TINY_FLAGS = setting_args(TINY)

# a load from bytes (window.daisy.load: /api/load checks the .pt, then loadState)
LOAD_JS = "(b64) => window.daisy.load(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)))"

# raw GROUP_STATE frames from this page to `to`: a state body (base64) or garbage, a run id
SEND_JS = """async ([to, b64, runId]) => {
  const f = await window.daisy.mesh.frames();
  const payload = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const chunks = await f.encodeMessage({ type: f.TYPES.GROUP_STATE, runId, payload },
                                       0x7fff0000 + Math.floor(Math.random() * 1e6), 64 * 1024);
  for (const c of chunks) await window.daisy.mesh.sendRaw(to, c);
  return chunks.length;
}"""


@pytest.fixture(scope="module")
def app_url():
    with offline_app("restore") as base:
        yield base


def write_checkpoint(path, steps: int, stop_after: int) -> str:
    """The reference trainer's first `stop_after` steps saved to path -> its hash (the last line's)."""
    lines = train_json("--peers", "2", "--steps", str(steps), "--stop-after", str(stop_after), *TINY_FLAGS, "--save", str(path))
    assert len(lines) == stop_after
    return lines[-1]["hashes"][0]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_checkpoint_loaded_on_one_page_of_three_all_show_its_hash_resume_together(app_url, pages, tmp_path):
    pt = tmp_path / "x.pt"
    file_hash = write_checkpoint(pt, 100, 20)
    a, b, c = open_group(pages, app_url + "/", 3)
    sa = state(a)
    loaded = a.evaluate(LOAD_JS, b64(pt.read_bytes()))
    assert (loaded["step"], loaded["hash"]) == (20, file_hash), loaded
    for page, label in ((a, "a"), (b, "b"), (c, "c")):
        wait_state(page, f"s.hash === {json.dumps(file_hash)} && s.step === 20 && s.runState === 'loaded' && !s.running",
                   f"{label} holds the file's state")
    wait_state(a, "s.notes.some((n) => n === 'Sent the checkpoint to 2 other device(s).')", "a says where it went")
    for page in (b, c):
        s = state(page)
        assert s["message"] == f"Loaded from {sa['name']}'s file: step 20, hash {file_hash[:16]}…", s["message"]
        assert s["config"]["width"] == 16 and s["totalSteps"] == 100 and page.evaluate("window.daisy.hasModel()") is True
    # Start on b (not the page that loaded): the whole group resumes at step 20
    b.get_by_role("button", name="Continue from step 20 of 100", exact=True).click()
    finals = [ended(page, label) for page, label in ((a, "a"), (b, "b"), (c, "c"))]
    sb = state(b)
    for s in finals:
        assert s["runState"] == "done" and s["step"] == 100, s["message"]
        assert s["run"]["leader"] == sb["peerId"] and len(s["run"]["roster"]) == 3, s["run"]
    want = train_hashes("--resume", str(pt), "--peers", "3")
    assert len(want) == 80
    for page, label in ((a, "a"), (b, "b (leader)"), (c, "c")):
        assert_hashes_equal(label, step_hashes(page), want, first=21)


def test_bad_or_untimely_group_states_are_refused_and_change_nothing(app_url, pages, tmp_path):
    pt = tmp_path / "x.pt"
    write_checkpoint(pt, 100, 20)
    long_pt = tmp_path / "long.pt"        # a run of 10000 steps: still going when the test acts
    write_checkpoint(long_pt, 10000, 3)
    a, b = open_group(pages, app_url + "/", 2)
    b.evaluate(LOAD_JS, b64(pt.read_bytes()))
    wait_state(a, "s.runState === 'loaded'", "a took b's file")
    sa, before = state(a), state(b)
    ck = load_checkpoint(long_pt)
    parts = dict(config=ck.config, step=ck.step, params=ck.params, adam_m=ck.adam_m, adam_v=ck.adam_v,
                 adam_t=ck.adam_t, extra=ck.extra)
    good = encode_state(**parts, weight_hash=ck.weight_hash)
    bad_width = good.replace(b'"width":16', b'"width":17', 1)
    assert bad_width != good
    cases = {
        "wrong hash": (encode_state(**parts, weight_hash="0" * 64), 0, "weight hash mismatch"),
        "garbage": (bytes((i * 131 + 7) & 0xFF for i in range(5000)), 0, "bad header length"),
        "weights only": (encode_state(config=ck.config, step=ck.step, params=ck.params, weight_hash=ck.weight_hash),
                         0, "no Adam moments"),
        "bad settings": (bad_width, 0, "model width (17) must be a multiple of heads (4)"),
        "inside a run": (good, 12345, "a restore travels outside runs"),
    }
    for label, (body, run_id, needle) in cases.items():
        n = a.evaluate("window.daisy.mesh.drops().count")
        a_notes = len(state(a)["notes"])
        b.evaluate(SEND_JS, [sa["peerId"], b64(body), run_id])
        a.wait_for_function(f"window.daisy.mesh.drops().count > {n}", timeout=10_000)
        said = "\n".join(a.evaluate("window.daisy.mesh.drops().recent")[-3:])
        assert needle in said, f"{label}: no {needle!r} in:\n{said}"
        if run_id == 0:      # checked after reassembly: the page says so too
            assert any(needle in x for x in state(a)["notes"][a_notes:]), f"{label}: {state(a)['notes']}"
        now = state(a)
        assert (now["hash"], now["step"], now["config"], now["runState"]) == \
            (before["hash"], before["step"], before["config"], "loaded"), label
    # the same bytes as a good state, sent by a page: a holds a model, so it is an offer (every
    # refusal above was its check); nothing replaces a model without its user's click: Ignore
    # keeps it, Load takes the offer
    sb = state(b)
    for click in ("Ignore", "Load"):
        b.evaluate(SEND_JS, [sa["peerId"], b64(good), 0])
        wait_state(a, f"s.restoreOffer && s.restoreOffer.step === {ck.step}", f"a is offered the state ({click})")
        offer = state(a)["restoreOffer"]
        assert offer["from"] == sb["peerId"] and offer["hash"] == ck.weight_hash, offer
        a.get_by_text(f"offers step {ck.step} of 10000, hash {ck.weight_hash[:16]}").wait_for(timeout=5_000)
        now = state(a)
        assert (now["hash"], now["step"]) == (before["hash"], before["step"]), "an offer changed the model"
        a.get_by_role("button", name=click, exact=True).click()
        wait_state(a, "!s.restoreOffer", f"{click}: the offer is gone")
    wait_state(a, f"s.hash === {json.dumps(ck.weight_hash)} && s.step === {ck.step}", "a took the good state on Load")
    assert state(a)["totalSteps"] == 10000
    # during a run: a resumes its new state with b; a GROUP_STATE then is refused, the run goes on
    a.evaluate("window.daisy.start()")
    wait_state(b, f"s.running && s.step >= {ck.step + 5}", "the resumed run trains", RUN_MS)
    n = b.evaluate("window.daisy.mesh.drops().count")
    b_notes = len(state(b)["notes"])
    a.evaluate(SEND_JS, [state(b)["peerId"], b64(encode_state(**parts, weight_hash=ck.weight_hash)), 0])
    b.wait_for_function(f"window.daisy.mesh.drops().count > {n}", timeout=10_000)
    assert "GROUP_STATE while a run is going" in "\n".join(b.evaluate("window.daisy.mesh.drops().recent")[-3:])
    assert any("a run is going on this device" in x for x in state(b)["notes"][b_notes:]), state(b)["notes"]
    step_then = state(b)["step"]
    wait_state(b, f"s.running && s.step >= {step_then + 5}", "the run goes on", RUN_MS)
    b.evaluate("window.daisy.stop()")
    s1, s2 = ended(a, "a stopped"), ended(b, "b stopped")
    assert s1["step"] == s2["step"] and s1["hash"] == s2["hash"]
    want = train_hashes("--resume", str(long_pt), "--peers", "2", "--stop-after", str(s1["step"] - ck.step))
    assert_hashes_equal("b", step_hashes(b), want, first=ck.step + 1)
