"""The page in headless Chromium, against `python app.py` on 127.0.0.1 (real uvicorn, real
sockets, a free port chosen at run time).

Two servers start side by side: the main one with HF_ENDPOINT at a port where nothing listens
(no network at all: the data route must fall back to the built-in corpus), and one with
HF_HUB_OFFLINE=1 and its port from $PORT, checked over plain HTTP.
"""
from __future__ import annotations

import json
import os
import secrets
import tempfile

import httpx
import pytest

from daisy.config import RANGES, Config
from daisy.space.page import ADVANCED, NO_MODEL, SETTINGS
from tests.app_server import WAIT_MS, free_port, open_peer, start_app, state, stop_app, wait_state, wait_up

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers():
    with tempfile.TemporaryDirectory(prefix="daisy-page-") as tmp:
        main_port, offline_port = free_port(), free_port()
        nowhere = f"http://127.0.0.1:{free_port()}"          # nothing listens there
        procs = [
            ("main", *start_app(tmp, "main", {"HF_ENDPOINT": nowhere},
                                ["--host", "127.0.0.1", "--port", str(main_port)]), main_port),
            ("offline", *start_app(tmp, "offline", {"HF_HUB_OFFLINE": "1", "HOST": "127.0.0.1",
                                                    "PORT": str(offline_port)}, []), offline_port),
        ]
        try:
            bases = {}
            for name, proc, _, port in procs:
                bases[name] = f"http://127.0.0.1:{port}"
                wait_up(proc, bases[name], os.path.join(tmp, f"{name}.log"))
            yield bases
        finally:
            for _, proc, log, _ in procs:
                stop_app(proc, log)


def roster_ids(page) -> set[str]:
    return {p["id"] for p in state(page)["peers"]}


def test_app_host_and_port_from_flags_and_environment():
    import app
    assert (app.parse_args([], env={}).host, app.parse_args([], env={}).port) == ("0.0.0.0", 7860)
    spaces = app.parse_args([], env={"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861"})
    assert (spaces.host, spaces.port) == ("0.0.0.0", 7861)
    both = app.parse_args([], env={"PORT": "8001", "GRADIO_SERVER_PORT": "7861", "HOST": "127.0.0.1"})
    assert (both.host, both.port) == ("127.0.0.1", 8001)
    flags = app.parse_args(["--host", "::1", "--port", "9000"], env={"PORT": "8001", "HOST": "127.0.0.1"})
    assert (flags.host, flags.port) == ("::1", 9000)
    with pytest.raises(SystemExit, match="PORT='http' is not a port number"):
        app.parse_args([], env={"PORT": "http"})


def test_offline_app_starts_and_says_why(servers):
    base = servers["offline"]                 # port came from $PORT, host from $HOST
    page = httpx.get(base + "/", timeout=5)
    assert page.status_code == 200 and "DaisyChain-Web" in page.text
    info = httpx.get(base + "/data/info", timeout=10).json()
    assert info["source"] == "builtin", info
    assert "offline" in info["reason"], info
    assert info["summary"] == "the Space runs offline (HF_HUB_OFFLINE): using the built-in corpus", info
    js = httpx.get(base + "/js/peer/ui.js", timeout=5)
    assert js.status_code == 200 and "javascript" in js.headers["content-type"], js.headers
    for r in (page, js):                      # cross-origin isolation: SharedArrayBuffer for threads
        assert r.headers.get("cross-origin-opener-policy") == "same-origin", r.headers
        assert r.headers.get("cross-origin-embedder-policy") == "credentialless", r.headers
    assert "export function mount" in js.text
    assert httpx.get(base + "/js/nope.js", timeout=5).status_code == 404
    for test_only in ("/js/gpu_bugs.js", "/js/b2b.js", "/js/mutants.js", "/kernels/does_not_compile.wgsl"):
        assert httpx.get(base + test_only, timeout=5).status_code == 404, f"{test_only} is test-only code"


def test_widgets_ranges_defaults_and_peer(servers, pages):
    page = open_peer(pages, servers["main"] + "/", "widgets")
    defaults = Config()
    page.locator("#daisy-advanced button").first.click()     # ADVANCED (local steps) is folded under "Speed"
    for name, label, step, _ in SETTINGS + ADVANCED:
        lo, hi, _ = RANGES[name]
        got = page.evaluate("""(id) => { const r = document.querySelector(`#${id} input[type=range]`);
            return r && {min: +r.min, max: +r.max, step: +r.step, value: +r.value}; }""", f"setting-{name}")
        want = {"min": lo, "max": hi, "step": step, "value": getattr(defaults, name)}
        assert got == want, f"slider {label} ({name}): got {got}, want {want}"
        assert label in page.inner_text(f"#setting-{name}")
    for text in ("Start training", "Stop", "Generate", "Download checkpoint (.pt)",
                 "Load checkpoint (.pt)", "Download inference kit"):
        assert page.get_by_role("button", name=text, exact=True).count() >= 1, f"no button {text!r}"
    for elem in ("gen-prompt", "gen-temperature", "gen-top-k", "gen-seed", "gen-output"):
        assert page.locator(f"#{elem}").count() == 1, f"no #{elem}"

    wait_state(page, "s.path !== null", "compute path decided")
    s = state(page)
    # the compute readout: a short label, the reason on demand (the old panel showed a paragraph)
    page.wait_for_function("document.querySelector('#daisy-peer [data-role=\"path\"]').textContent !== 'checking…'",
                           timeout=WAIT_MS)
    label = page.inner_text('#daisy-peer [data-role="path"]')
    assert label == s["pathLabel"] and len(label) <= 60 and s["pathReason"] not in label, (label, s["pathReason"])
    assert label.startswith(("CPU (", "GPU (")) and "every GEMM" not in label, label
    detail = page.evaluate("document.querySelector('#daisy-peer [data-role=\"path-detail\"]').textContent")
    assert s["pathReason"] in detail, (detail, s["pathReason"])
    # the page is cross-origin isolated (the app's COOP/COEP headers), so its CPU backend runs on
    # every core the browser reports (frontend_js/cpu/threads.js), and the label says how many
    assert page.evaluate("crossOriginIsolated") is True, "the page is not cross-origin isolated"
    cores = min(page.evaluate("navigator.hardwareConcurrency"), 16)
    assert s["threads"] == ({"count": cores, "shared": True, "reason": None} if cores > 1
                            else {"count": 1, "shared": False, "reason": "this device reports one core"}), s["threads"]
    if cores > 1:
        assert f"{cores} threads" in label and f"runs on {cores} threads" in s["pathReason"], (label, s["pathReason"])
    # generation's temperature reaches 0 = greedy, as in the kit and daisy.generate
    assert page.evaluate("+document.querySelector('#gen-temperature input[type=range]').min") == 0
    # nothing to continue yet: no Continue button, and the API says so
    assert not page.locator("#daisy-continue").is_visible()
    err = page.evaluate("window.daisy.start({resume: true}).then(() => 'started', (e) => e.message)")
    assert err.startswith("nothing to continue: this tab holds no model"), err
    assert len(s["peerId"]) == 16 and s["group"]["kind"] == "network" and s["role"] == "member", s
    assert s["peers"] and s["peers"][0]["id"] == s["peerId"], s
    assert s["path"] in ("cpu", "gpu") and s["step"] == 0 and s["hash"] is None, s
    for key in ("peerId", "group", "role", "step", "loss", "hash", "path", "peers"):
        assert key in s, f"state() lacks {key}"
    panel = page.inner_text("#daisy-peer")
    assert "Peers" in panel and s["name"] in panel and "no run yet" in panel, panel

    # widgets that need a model say so while there is none
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function(f"document.querySelector('#gen-output textarea').value === {json.dumps(NO_MODEL)}",
                           timeout=WAIT_MS)
    page.get_by_role("button", name="Download checkpoint (.pt)").click()
    assert NO_MODEL in page.inner_text("#model-status")


def test_offline_the_data_line_says_what_it_means_and_the_detail_opens_from_it(servers, pages):
    # no network (the main server's HF_ENDPOINT answers nothing): the line says what that means,
    # the raw exception opens from it, as the compute line's reason does; the panel says the same
    page = open_peer(pages, servers["main"] + "/", "data")
    page.wait_for_function("!!document.querySelector('#daisy-data-status details summary')", timeout=WAIT_MS)
    meaning = "the Hub could not be reached: using the built-in corpus"
    assert page.inner_text("#daisy-data-status summary") == f"Training data: {meaning}"
    shown = page.inner_text("#daisy-data-status")
    assert "ConnectError" not in shown and "unreachable:" not in shown, shown
    page.click("#daisy-data-status summary")
    page.wait_for_function("document.querySelector('#daisy-data-status details').open", timeout=WAIT_MS)
    assert "unreachable: ConnectError" in page.inner_text("#daisy-data-status"), page.inner_text("#daisy-data-status")
    readout = '#daisy-peer [data-role="data"]'
    page.wait_for_function(f"document.querySelector('{readout}').textContent !== 'checking…'", timeout=WAIT_MS)
    assert page.inner_text(readout) == meaning
    detail = page.evaluate("document.querySelector('#daisy-peer [data-role=\"data-detail\"]').textContent")
    assert detail.startswith("unreachable: ConnectError"), detail


# counts the requestAnimationFrame calls of Gradio's status-tracker module that reach the browser
# (this init script runs first, so the page's frame guard, when served, wraps it)
COUNT_LOADER_FRAMES = """(() => { const request = window.requestAnimationFrame.bind(window); window.loaderFrames = 0;
  window.requestAnimationFrame = (cb) => { if (/statustracker-/.test(new Error().stack || '')) window.loaderFrames++; return request(cb); }; })();"""


def test_an_idle_page_draws_no_frames_for_gradios_loader(servers, pages):
    # Gradio's app loader leaks a requestAnimationFrame loop (a frame at every vsync, for ever);
    # the frame guard served first in <head> (frontend_js/peer/frame_guard.js) ends it once the
    # peer is mounted. Without it this counts ~30-60 more every second.
    html = httpx.get(servers["main"] + "/").text
    assert html.index('<script src="/js/peer/frame_guard.js"></script>') < html.index('<script type="module"'), html[:400]
    page = open_peer(pages, servers["main"] + "/", "frames", COUNT_LOADER_FRAMES)
    page.wait_for_timeout(500)
    before = page.evaluate("window.loaderFrames")
    page.wait_for_timeout(3000)
    assert page.evaluate("window.loaderFrames") - before <= 2, (before, page.evaluate("window.loaderFrames"))


def test_a_software_adapter_is_the_cpu_in_the_peer_table_as_in_the_compute_line(servers, pages):
    # WebGPU here is SwiftShader, a software adapter: its steps run on the CPU, and both the
    # compute line and the path column of the peer table say so
    page = open_peer(pages, servers["main"] + "/", "path")
    wait_state(page, "s.path !== null", "compute path decided")
    s = state(page)
    assert page.evaluate("!!navigator.gpu") and s["pathLabel"].endswith("WebGPU adapter is software"), s["pathLabel"]
    assert s["path"] == "cpu" and s["pathLabel"].startswith("CPU ("), (s["path"], s["pathLabel"])
    cell = f'#daisy-peer tr[data-peer="{s["peerId"]}"] td:nth-child(2)'
    page.wait_for_function(f"(document.querySelector('{cell}') || {{}}).textContent === 'CPU'", timeout=WAIT_MS)
    assert page.inner_text('#daisy-peer [data-role="path"]').split(" ")[0] == page.inner_text(cell) == "CPU"


def test_two_pages_on_one_machine_share_a_group(servers, pages):
    a = open_peer(pages, servers["main"] + "/", "a")
    b = open_peer(pages, servers["main"] + "/", "b")
    a_id, b_id = state(a)["peerId"], state(b)["peerId"]
    assert a_id != b_id
    wait_state(a, f"s.peers.some((p) => p.id === {json.dumps(b_id)})", "a sees b")
    wait_state(b, f"s.peers.some((p) => p.id === {json.dumps(a_id)})", "b sees a")
    assert state(a)["group"] == state(b)["group"]
    # and the roster is on the page, with each peer's compute path once it announced it
    wait_state(b, "s.path !== null", "b's path decided")
    b_path = state(b)["path"].upper()
    a.wait_for_function(f"""(document.querySelector('#daisy-peer tr[data-peer="{b_id}"]') || {{}})
                           .innerText?.includes('{b_path}')""", timeout=WAIT_MS)


def test_room_with_host_approval_end_to_end(servers, pages):
    room = "t-" + secrets.token_hex(6)
    url = f"{servers['main']}/?room={room}"
    host = open_peer(pages, url, "host")
    assert state(host)["role"] == "host"
    host_id = state(host)["peerId"]

    guest = open_peer(pages, url, "guest")
    g = state(guest)
    assert g["role"] == "pending" and roster_ids(guest) == {g["peerId"]}, g
    host.get_by_role("button", name="Accept").wait_for(timeout=WAIT_MS)
    host.click(f'#daisy-peer button.accept[data-peer="{g["peerId"]}"]')
    wait_state(guest, "s.role === 'member'", "guest accepted")
    wait_state(guest, f"s.peers.some((p) => p.id === {json.dumps(host_id)})", "guest sees the host")
    wait_state(host, f"s.peers.some((p) => p.id === {json.dumps(g['peerId'])})", "host sees the guest")
    host.wait_for_selector(f'#daisy-peer tr[data-peer="{g["peerId"]}"]', timeout=WAIT_MS)
    assert "host" in host.inner_text(f'#daisy-peer tr[data-peer="{host_id}"]')

    intruder = open_peer(pages, url, "intruder")
    i_id = state(intruder)["peerId"]
    host.wait_for_selector(f'#daisy-peer button.reject[data-peer="{i_id}"]', timeout=WAIT_MS)
    host.click(f'#daisy-peer button.reject[data-peer="{i_id}"]')
    wait_state(intruder, "s.rejected && s.signal === 'closed'", "intruder told it was rejected")
    assert roster_ids(intruder) == {i_id}, "a rejected peer learned about members"
    intruder.wait_for_function("document.querySelector('#daisy-peer').innerText.includes('declined')",
                               timeout=WAIT_MS)
    said = state(intruder)["message"]
    assert said == f'Not admitted to room "{room}": the host declined the request to join. Reload the page to ask again.', said
    assert said.count("declined") == 1, said
    assert i_id not in roster_ids(host) and i_id not in roster_ids(guest)
    assert state(host)["requests"] == []


def test_start_trains_and_the_hash_moves(servers, pages):
    page = open_peer(pages, servers["main"] + "/", "trainer")
    # 10000 steps: still running when the roster row is read (a tiny step takes ~1 ms on the CPU)
    tiny = {"width": 16, "seq_len": 16, "batch": 2, "steps": 10000, "layers": 1, "heads": 4}
    page.evaluate("(cfg) => window.daisy.start(cfg)", tiny)
    wait_state(page, "s.step >= 1 && s.hash", "first step")
    first = state(page)
    wait_state(page, f"s.step >= {first['step'] + 2}", "two more steps")
    later = state(page)
    assert later["hash"] != first["hash"], "weights did not change between steps"
    assert isinstance(later["loss"], float) and later["loss"] > 0, later["loss"]
    assert later["config"]["width"] == 16 and later["running"], later
    page.wait_for_function("document.querySelector('#daisy-peer svg.daisy-loss polyline')", timeout=WAIT_MS)
    me = '#daisy-peer tr[data-peer="%s"]' % later["peerId"]
    page.wait_for_function(f"document.querySelector('{me}').innerText.includes('training')", timeout=WAIT_MS)
    row = page.inner_text(me)
    assert "leader" in row and later["path"].upper() in row, row
    assert page.evaluate("window.daisy.stop()") is True
    wait_state(page, "!s.running && s.runState === 'stopped'", "run stopped")
    stopped = state(page)
    at = stopped["step"]
    assert stopped["resumable"] == {"step": at, "steps": 10000, "from": "stopped"}, stopped["resumable"]

    # after a run, the widgets say what the tab holds without a click
    page.get_by_role("button", name=f"Continue from step {at} of 10000", exact=True).wait_for(timeout=WAIT_MS)
    assert page.get_by_role("button", name="Start a new run", exact=True).count() == 1
    page.wait_for_function("!document.querySelector('#model-status').innerText.includes('Train or load')", timeout=WAIT_MS)
    assert f"step {at}" in page.inner_text("#model-status"), page.inner_text("#model-status")
    assert page.evaluate("document.querySelector('#gen-output textarea').placeholder") != NO_MODEL

    # the loss curve: axis labels "step" and "loss", each number a label of its own
    labels = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#daisy-peer svg.daisy-loss text')]
                                 .map((t) => [t.getAttribute('class'), t.textContent]))""")
    assert labels["daisy-plot-x-axis"] == "step" and labels["daisy-plot-y-axis"] == "loss", labels
    assert labels["daisy-plot-x-max"] == str(at), labels
    for key in ("daisy-plot-y-min", "daisy-plot-y-max"):
        float(labels[key])                       # a number alone, not "2.298 · step 1"
    assert labels["daisy-plot-title"], labels

    # Continue goes on from the stopped step: the same hashes as one uninterrupted run
    page.evaluate("""() => { window.stepHashes = {};
                             window.daisy.on('step', (e) => { window.stepHashes[e.step] = e.hash; }); }""")
    page.get_by_role("button", name=f"Continue from step {at} of 10000", exact=True).click()
    wait_state(page, f"s.running && s.step >= {at + 3}", "continued steps")
    page.evaluate("window.daisy.stop()")
    wait_state(page, "!s.running", "continued run stopped")
    continued = page.evaluate("window.stepHashes")
    assert min(int(k) for k in continued) == at + 1, f"Continue did not go on at step {at + 1}: {sorted(continued)[:5]}"
    page.evaluate("() => { window.stepHashes = {}; }")
    page.evaluate("(cfg) => window.daisy.start(cfg)", {**tiny, "resume": False})
    wait_state(page, f"s.step >= {at + 3}", "the uninterrupted run")
    page.evaluate("window.daisy.stop()")
    wait_state(page, "!s.running", "uninterrupted run stopped")
    whole = page.evaluate("window.stepHashes")
    assert min(int(k) for k in whole) == 1, "resume: false did not start at step 0"
    for k in range(at + 1, at + 4):
        assert continued[str(k)] == whole[str(k)], f"step {k}: continued {continued[str(k)]}, uninterrupted {whole[str(k)]}"
    err = page.evaluate("window.daisy.start({resume: 'yes'}).then(() => 'started', (e) => e.message)")
    assert err == 'resume must be true or false, got "yes"', err

    # Start a new run runs the sliders' settings (the defaults here, and local steps 4 under "Speed",
    # folded until opened)
    page.locator("#daisy-advanced button").first.click()
    set_box(page, "local_steps", "4")
    page.get_by_role("button", name="Start a new run", exact=True).click()
    wait_state(page, "s.running && s.step >= 1", "run from the button")
    got = {k: v for k, v in state(page)["config"].items() if k in {n for n, *_ in SETTINGS + ADVANCED}}
    assert got == {**{n: getattr(Config(), n) for n, *_ in SETTINGS}, "local_steps": 4}, got
    # the widgets follow the state on a later turn of the page: hidden within the wait, or the test fails
    page.locator("#daisy-continue").wait_for(state="hidden", timeout=WAIT_MS)   # no Continue while a run is going
    page.get_by_role("button", name="Start a new run", exact=True).click()      # a second start is refused
    page.wait_for_function("document.querySelector('#daisy-peer').innerText.includes('already going')",
                           timeout=WAIT_MS)
    page.get_by_role("button", name="Stop", exact=True).click()
    wait_state(page, "!s.running", "stopped from the button")
    # bad settings get a clear error naming the setting; the page stays usable
    err = page.evaluate("(cfg) => window.daisy.start(cfg).then(() => 'started', (e) => e.message)",
                        {"width": 999})
    assert "model width (width) must be in 16..128" in err, err


def set_box(page, name: str, value: str) -> None:
    """Type into a setting's number box as a user does: the value, Enter, then focus leaves the box
    (its change event), and the box still shows it. (Once, in a full run, a Start clicked right
    after Enter ran local_steps 1 where 4 was typed into the box of the accordion just opened.)"""
    box = page.locator(f"#setting-{name} input[type=number]")
    box.fill(value)
    box.press("Enter")
    box.blur()
    page.wait_for_function("([sel, v]) => document.querySelector(sel)?.value === v",
                           arg=[f"#setting-{name} input[type=number]", value], timeout=WAIT_MS)


def test_settings_outside_the_sliders_are_refused_by_name(servers, pages):
    page = open_peer(pages, servers["main"] + "/", "settings")
    wait_state(page, "s.path !== null", "compute path decided")
    cases = [
        ("width", "17", "Model width must be one of 16, 32, …, 128 (steps of 16); the box says 17."),
        ("batch", "2.5", "Batch per device must be a whole number from 2 to 32; the box says 2.5."),
    ]
    for name, typed, message in cases:
        set_box(page, name, typed)
        page.get_by_role("button", name="Start training", exact=True).click()
        try:
            page.wait_for_function("(m) => document.querySelector('#daisy-start-status').innerText.includes(m)",
                                   arg=message, timeout=WAIT_MS)
        except Exception:
            raise AssertionError(f"{name}={typed}: the page says {page.inner_text('#daisy-start-status')!r}")
        assert "heads" not in page.inner_text("#daisy-start-status")
        s = state(page)
        assert not s["running"] and s["step"] == 0 and s["error"] == "", s
        set_box(page, name, str(getattr(Config(), name)))
    # the sliders' own values start, and the line under the buttons clears
    set_box(page, "steps", "100")
    page.get_by_role("button", name="Start training", exact=True).click()
    wait_state(page, "s.running && s.step >= 1", "a run with the sliders' values")
    page.wait_for_function("document.querySelector('#daisy-start-status').innerText.trim() === ''", timeout=WAIT_MS)
    page.evaluate("window.daisy.stop()")
    wait_state(page, "!s.running", "stopped")


def test_a_page_framed_by_another_site_runs_its_units_on_workers_and_offers_its_own_tab(servers, pages, tmp_path):
    # the Space inside huggingface.co's iframe: the parent sends no isolation headers, so the
    # framed page has no SharedArrayBuffer; its INT8 units run on unit workers (copied buffers,
    # frontend_js/cpu/unit_workers.js), it says why, and links to itself in a tab of its own
    from tests.browser import static_server
    base = servers["main"]
    (tmp_path / "index.html").write_text('<!doctype html><link rel="icon" href="data:,">'
                                         f'<iframe src="{base}/" width="1200" height="900"></iframe>')
    with static_server(tmp_path) as host:
        page = pages.new_page(host.replace("127.0.0.1", "localhost") + "/index.html", "framing site")
        frame = page.locator("iframe").element_handle(timeout=WAIT_MS).content_frame()
        frame.wait_for_function("window.daisy && window.daisy.state().threads && window.daisy.state().path",
                                timeout=WAIT_MS)
        assert frame.evaluate("crossOriginIsolated") is False
        cores = min(frame.evaluate("navigator.hardwareConcurrency"), 16)
        assert cores > 1, "the unit workers need a machine with two cores or more"
        threads = frame.evaluate("window.daisy.state().threads")
        no_sab = "SharedArrayBuffer is not available (the page is not cross-origin isolated)"
        assert threads == {"count": cores, "shared": False, "reason": f"{no_sab}: the INT8 units run on {cores} threads "
                           "with copied buffers, the row kernels on one"}, threads
        label = frame.evaluate("window.daisy.state().pathLabel")
        assert f"wasm-simd × {cores} workers" in label, label
        link = frame.locator('#daisy-peer [data-role="own-tab"]')
        link.wait_for(state="visible", timeout=WAIT_MS)
        assert link.get_attribute("href") == base + "/" and link.get_attribute("target") == "_blank"
        assert f"runs on {cores} threads ({no_sab}" in frame.evaluate("window.daisy.state().pathReason")
