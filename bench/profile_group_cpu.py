"""Where a group step's CPU goes (issue 25: "if a target is out of reach on this machine, say which
resource bounds it, with the profile that shows it"): the `lan` pair of bench/bench_wire.py (each
page its own headless Chromium in its own tools/netlab namespace, pinned to its own core, the CPU
path), profiled by CPU accounting instead of wall time. A tool, not a benchmark.

Method. One page alone, then the group of P pages, on the same lab, app and pinning as
bench_wire.py. While each run goes, a sampler thread reads every --sample-ms:
  - every process of this bench's tree (/proc, descendants of this process): each Chromium's
    browser, zygote, renderer, GPU, network and other utility processes (which page's: the
    process's network namespace), the app (`python app.py`: uvicorn), the lab's router
    (`python -m tools.netlab.router`: every packet between pages goes through it), Playwright's
    driver and this process; per thread (/proc/PID/task/TID): utime + stime (CPU time), schedstat
    (time on the CPU and time runnable but waiting for one, ns), and the CPU it last ran on;
  - /proc/stat per CPU: busy time of the whole machine (the rest of it: other people's work);
  - each process's and thread's allowed CPUs (Cpus_allowed_list, what `taskset -p` prints).
After the run the leader's step times (performance.now() at each 'step' event, mapped onto this
process's clock by one round trip) give the steady window: the sample nearest step --skip to the
sample nearest the last step, and the steps between them (interpolated). Every counter's delta
over the window is divided by those steps: CPU ms per group step, per role and per thread name,
next to the same for the page alone, and a summary by part (the pages' main threads, the
transport, frames, the router, the app, the harness: group - P x alone) with the CPU-bound check
(the group's CPU over the cores against its ms/step). CPU time does not grow when other work shares the core (a
busy machine stretches wall time, not CPU time), so these numbers are far less sensitive to the
load than ms/step; "waiting for a CPU" (schedstat's run-queue delay) is what the load adds, and
says which threads were kept from their core.

--v8 also takes the V8 sampling profile (CDP Profiler, as bench/profile_e2e.py) of every page
over the same window (the profiler is started at step --skip and stopped at the last step) and
prints self time per step by function for the page alone and each group page: what a page
computes beyond the local step. The profiler costs a few % of the renderer's main thread, so take
the CPU table from a run without it.

    python bench/profile_group_cpu.py                                   # lan, large, 2 pages, audits off
    python bench/profile_group_cpu.py --steps 14 --skip 4 --audit-rate 0.1 --v8
    python bench/profile_group_cpu.py --settings default --steps 60 --skip 10 --json /tmp/cpu.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from tools.netlab import Netlab, profile                                   # noqa: E402
from tests.app_server import state                                         # noqa: E402
from tests.netlab_pages import LabPages, lab_app, room_group, room_url      # noqa: E402
from bench_mesh import DEFAULT, LARGE, RECORD, load                        # noqa: E402
from profile_e2e import self_times                                         # noqa: E402

SETTINGS = {"default": DEFAULT, "large": LARGE}
TICK = os.sysconf("SC_CLK_TCK")


# ---- /proc --------------------------------------------------------------------------------------
def read(path: str, mode: str = "r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def stat_fields(text: str) -> tuple[str, list[str]]:
    """/proc/.../stat -> (comm, the fields after it: [0] = state, so field k of proc(5) is [k - 3])."""
    l, r = text.index("("), text.rindex(")")
    return text[l + 1:r], text[r + 2:].split()


def children_map() -> dict[int, list[int]]:
    kids = collections.defaultdict(list)
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = read(f"/proc/{d}/stat")
            if s:
                kids[int(stat_fields(s)[1][1])].append(int(d))
    return kids


def tree(root: int) -> list[int]:
    kids, out, todo = children_map(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def allowed(pid: int, tid: int | None = None) -> str:
    s = read(f"/proc/{pid}/task/{tid}/status" if tid else f"/proc/{pid}/status") or ""
    return next((line.split(":", 1)[1].strip() for line in s.splitlines() if line.startswith("Cpus_allowed_list")), "?")


def role_of(pid: int, me: int, router: int, netns: dict[int, int]) -> tuple[str, str]:
    """-> (owner, role): owner 'page i' (its Chromium's namespace), 'host'; role a short name."""
    # (Chromium's child processes rewrite their command line as one string: split on spaces too)
    argv = (read(f"/proc/{pid}/cmdline", "rb") or b"").replace(b"\0", b" ").decode(errors="replace").split()
    if pid == me:
        return "host", "bench (this process, Playwright's client)"
    if pid == router:
        return "host", "netlab router"
    try:
        ino = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        ino = None
    owner = f"page {netns[ino]}" if ino in netns else "host"
    joined = " ".join(argv)
    if "app.py" in joined:
        return owner, "app server (uvicorn)"
    if "chromium" in (argv[0] if argv else "") or "--type=" in joined:
        kind = next((a.split("=", 1)[1] for a in argv if a.startswith("--type=")), "browser")
        if kind == "utility":
            sub = next((a.split("=", 1)[1] for a in argv if a.startswith("--utility-sub-type=")), "utility")
            kind = {"network.mojom.NetworkService": "network", "storage.mojom.StorageService": "storage"}.get(sub, sub)
        return owner, f"chromium {kind}"
    if argv and ("node" in os.path.basename(argv[0]) or "playwright" in joined):
        return owner, "playwright driver"
    return owner, os.path.basename(argv[0]) if argv else "?"


class Sampler(threading.Thread):
    """Every `every` s: {tid: (pid, comm, cpu ticks, run ns, wait ns, last cpu)} of the tree of
    `root`, and /proc/stat's per-CPU busy ticks; the roles are read when a process is first seen."""

    def __init__(self, root: int, router: int, netns: dict[int, int], every: float):
        super().__init__(daemon=True)
        self.root, self.router, self.netns, self.every = root, router, netns, every
        self.samples: list[tuple[float, dict, dict]] = []
        self.roles: dict[int, tuple[str, str]] = {}
        self.cpus_allowed: dict[int, str] = {}
        self.thread_allowed: dict[tuple[int, str], set] = collections.defaultdict(set)
        self.stop_at = threading.Event()

    def snapshot(self) -> tuple[float, dict, dict]:
        t = time.monotonic()
        threads = {}
        for pid in tree(self.root):
            if pid not in self.roles:
                self.roles[pid] = role_of(pid, self.root, self.router, self.netns)
                self.cpus_allowed[pid] = allowed(pid)
            for tid_s in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
                s = read(f"/proc/{pid}/task/{tid_s}/stat")
                sch = read(f"/proc/{pid}/task/{tid_s}/schedstat")
                if not s or not sch:
                    continue
                comm, f = stat_fields(s)
                run_ns, wait_ns = (int(x) for x in sch.split()[:2])
                threads[int(tid_s)] = (pid, comm, int(f[11]) + int(f[12]), run_ns, wait_ns, int(f[36]))
                key = (pid, comm)
                if key not in self.thread_allowed:
                    self.thread_allowed[key].add(allowed(pid, int(tid_s)))
        cpus = {}
        for line in (read("/proc/stat") or "").splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *v = line.split()
                v = [int(x) for x in v]
                cpus[name] = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7], sum(v))   # busy (user nice system irq softirq steal), all
        return t, threads, cpus

    def run(self) -> None:
        while not self.stop_at.is_set():
            self.samples.append(self.snapshot())
            self.stop_at.wait(self.every)

    def stop(self) -> None:
        self.stop_at.set()
        self.join()
        self.samples.append(self.snapshot())


# ---- one run ------------------------------------------------------------------------------------
def clock_offset(page) -> float:
    """time.monotonic() - performance.now()/1000 of `page`, by the shortest of a few round trips."""
    best = None
    for _ in range(5):
        t0 = time.monotonic()
        now = page.evaluate("performance.now()") / 1000
        t1 = time.monotonic()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, (t0 + t1) / 2 - now)
    return best[1]


V8_AT = """([skip, last]) => {
  window.daisy.on('step', (e) => { if (e.step === skip || e.step === last) window.bench.v8.push(e.step); });
  window.bench.v8 = [];
}"""


def run_once(lab, pages, base, P: int, settings: dict, steps: int, skip: int, audit: float, every: float, v8: bool) -> dict:
    group = room_group(pages, room_url(base, "&gpu=off"), list(range(P)), [i % len(os.sched_getaffinity(0)) for i in range(P)])
    try:
        for page in group:
            page.evaluate(RECORD, [skip, steps])
            if v8:
                page.evaluate(V8_AT, [skip, steps])
        offsets = [clock_offset(page) for page in group]
        engines = [state(page).get("engine") for page in group]
        cdps = []
        if v8:
            for page in group:
                cdp = page.context.new_cdp_session(page)
                cdp.send("Profiler.enable")
                cdp.send("Profiler.setSamplingInterval", {"interval": 1000})
                cdps.append(cdp)
        netns = {os.stat(f"/run/netns/{lab.ns(i)}").st_ino: i for i in range(len(lab.links))}
        sampler = Sampler(os.getpid(), lab.router.pid, netns, every)
        sampler.start()
        cfg = {**settings, "steps": max(100, steps), "auditRate": audit}
        err = group[0].evaluate("(cfg) => window.daisy.start(cfg).then(() => '', (e) => e.message || String(e))", cfg)
        if err:
            raise RuntimeError(f"start refused: {err}")
        profiling = False
        # polled by a cheap evaluate every second (a wait_for_function polls the page every frame)
        while True:
            time.sleep(1.0)
            b = group[0].evaluate("window.bench.end ? window.bench.end.step : 0")
            if v8 and not profiling and b >= skip:
                for cdp in cdps:
                    cdp.send("Profiler.start")
                profiling = True
            done = [page.evaluate("(() => { const s = window.daisy.state(); return !s.running && ['done','stopped','failed'].includes(s.runState) ? s.runState : ''; })()")
                    for page in group]
            if all(done):
                break
        sampler.stop()
        profiles = [cdp.send("Profiler.stop")["profile"] for cdp in cdps] if profiling else []
        finals = [state(page) for page in group]
        benches = [page.evaluate("window.bench") for page in group]
    finally:
        pages.close_all()
        time.sleep(0.5)
    if any(f["runState"] == "failed" for f in finals):
        raise RuntimeError(f"a run failed: {[f.get('message') for f in finals]}")
    hashes = {f["hash"] for f in finals}
    lead = benches[0]
    last = max(int(k) for k in lead["t"])
    t_skip, t_last = lead["t"][str(skip)] / 1000 + offsets[0], lead["t"][str(last)] / 1000 + offsets[0]
    ts = sorted(sampler.samples, key=lambda s: s[0])
    a = min(range(len(ts)), key=lambda i: abs(ts[i][0] - t_skip))
    z = min(range(len(ts)), key=lambda i: abs(ts[i][0] - t_last))
    step_times = sorted((lead["t"][k] / 1000 + offsets[0], int(k)) for k in lead["t"])

    def step_at(t: float) -> float:         # steps done at time t (interpolated between step events)
        prev = (lead["runStart"] / 1000 + offsets[0], 0)
        for tt, k in step_times:
            if tt >= t:
                return prev[1] + (t - prev[0]) / (tt - prev[0]) * (k - prev[1]) if tt > prev[0] else k
            prev = (tt, k)
        return prev[1]

    n_steps = step_at(ts[z][0]) - step_at(ts[a][0])
    gaps = [lead["t"][str(k + 1)] - lead["t"][str(k)] for k in range(skip, last)]
    return {"P": P, "samples": (ts[a], ts[z]), "steps": n_steps, "window_s": ts[z][0] - ts[a][0],
            "ms_step": statistics.median(gaps), "roles": dict(sampler.roles), "allowed": dict(sampler.cpus_allowed),
            "thread_allowed": {f"{k[0]}:{k[1]}": sorted(v) for k, v in sampler.thread_allowed.items()},
            "engines": engines, "hashes_equal": len(hashes) == 1, "last_step": [f["step"] for f in finals],
            "profiles": profiles, "wait": [(b["end"]["waitMs"] - b["at"]["waitMs"]) / max(1, b["end"]["step"] - skip)
                                           for b in benches if b.get("at") and b.get("end")]}


# ---- accounting ---------------------------------------------------------------------------------
def account(r: dict) -> dict:
    """-> {"procs": {(owner, role): [cpu ms, run ms, wait ms] per step}, "threads": {(owner, role,
    thread): [cpu, run, wait] ms per step}, "cpus": {cpu: (busy ms per step, ours ms per step)}, "ran_on": ...}"""
    (_, th_a, cpu_a), (_, th_b, cpu_b) = r["samples"]
    n = r["steps"]
    procs = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    threads = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    ran_on = collections.defaultdict(collections.Counter)
    for tid, (pid, comm, ticks, run_ns, wait_ns, cpu) in th_b.items():
        if tid in th_a:
            _, _, t0, r0, w0, _ = th_a[tid]
        else:
            t0 = r0 = w0 = 0                  # born inside the window
        owner, role = r["roles"].get(pid, ("host", "?"))
        d = [(ticks - t0) * 1000 / TICK / n, (run_ns - r0) / 1e6 / n, (wait_ns - w0) / 1e6 / n]
        for acc in (procs[(owner, role)], threads[(owner, role, comm)]):
            for i in range(3):
                acc[i] += d[i]
        if d[1] > 0.5:
            ran_on[(owner, role)][f"cpu{cpu}"] += d[1]
    ours_run = sum(v[1] for v in procs.values())
    cpus = {}
    for name in cpu_b:
        busy = (cpu_b[name][0] - cpu_a[name][0]) * 1000 / TICK / n
        total = (cpu_b[name][1] - cpu_a[name][1]) * 1000 / TICK / n
        cpus[name] = (busy, total)
    return {"procs": dict(procs), "threads": dict(threads), "cpus": cpus, "ours": ours_run, "ran_on": ran_on}


# (owner, role, thread) -> the part of the step it does (the summary's rows)
def category(owner: str, role: str, thread: str) -> str:
    if role == "chromium renderer":
        if thread == "chromium":
            return "pages' main threads (local step, Adam, the exchange's JS, frames' main-thread work)"
        if thread.startswith("WebRTC") or thread == "Chrome_ChildIOT":
            return "transport: the renderers' WebRTC and IO threads (SCTP, DTLS, IPC)"
        if thread == "Compositor":
            return "frames: the renderers' compositors and the GPU processes"
        return "the renderers' other threads (thread pool: WebCrypto, GC, fetch)"
    if role == "chromium network":
        return "transport: the network service processes (UDP sockets)"
    if role == "chromium gpu-process":
        return "frames: the renderers' compositors and the GPU processes"
    if role.startswith("chromium"):
        return "the browser and other Chromium processes"
    if role in ("netlab router", "app server (uvicorn)"):
        return role
    return "harness (this bench, Playwright)"


def summary(A: dict, G: dict, P: int, alone: dict, group: dict, cores: int) -> list[str]:
    """group - P x alone per category, and the CPU-bound check: the group's CPU (harness excluded)
    over the cores against the measured ms/step."""
    cat = lambda acc: collections.Counter({c: v for c, v in _sum_by(acc).items()})
    a, g = cat(A["threads"]), cat(G["threads"])
    lines = ["", f"Summary: CPU ms per step by part, the group against {P} pages alone",
             f"| part | alone | {P} × alone | group | group − {P} × alone |", "|---|---|---|---|---|"]
    for c in sorted(set(a) | set(g), key=lambda c: -g.get(c, 0)):
        lines.append(f"| {c} | {a.get(c, 0):.0f} | {P * a.get(c, 0):.0f} | {g.get(c, 0):.0f} | {g.get(c, 0) - P * a.get(c, 0):+.0f} |")
    harness = "harness (this bench, Playwright)"
    ga, aa = sum(g.values()) - g.get(harness, 0), sum(a.values()) - a.get(harness, 0)
    lines.append(f"| all but the harness | {aa:.0f} | {P * aa:.0f} | {ga:.0f} | {ga - P * aa:+.0f} |")
    lines.append(f"CPU-bound check: the group's CPU but the harness over {cores} cores = {ga / cores:.0f} ms per step "
                 f"(perfect packing), measured {group['ms_step']:.0f} ms/step (wall: the load stretches it); one page alone "
                 f"{alone['ms_step']:.0f} ms/step. A scaling s needs the group step <= {P} x alone / s: at 1.8x, "
                 f"{P * alone['ms_step'] / 1.8:.0f} ms, i.e. <= {cores * P * alone['ms_step'] / 1.8:.0f} ms of CPU per step on {cores} cores.")
    return lines


def _sum_by(threads: dict) -> dict:
    out = collections.Counter()
    for (owner, role, thread), v in threads.items():
        out[category(owner, role, thread)] += v[0]
    return out


def table(alone: dict, group: dict, top: int) -> str:
    A, G = account(alone), account(group)
    P = group["P"]
    lines = [f"one page alone: {alone['steps']:.1f} steps over {alone['window_s']:.1f} s (ms/step median {alone['ms_step']:.0f}, "
             f"engine {alone['engines'][0]}); group of {P}: {group['steps']:.1f} steps over {group['window_s']:.1f} s "
             f"(ms/step median {group['ms_step']:.0f}, engines {sorted(set(map(str, group['engines'])))}, exchange wait "
             f"{', '.join(f'{w:.0f}' for w in group['wait'])} ms/step per page, hashes equal {group['hashes_equal']})",
             "",
             "CPU ms per step, by process (cpu = utime+stime; run / wait-for-CPU = schedstat); allowed CPUs = taskset -p",
             "| owner | process | alone: cpu | run | wait | group: cpu | run | wait | group − alone (cpu) | allowed CPUs | ran on (group) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted(set(A["procs"]) | set(G["procs"]), key=lambda k: -(G["procs"].get(k, [0])[0] + A["procs"].get(k, [0])[0]))
    allowed_of = {}
    for r in (alone, group):
        for pid, (owner, role) in r["roles"].items():
            allowed_of.setdefault((owner, role), set()).add(r["allowed"].get(pid, "?"))
    for k in keys:
        a, g = A["procs"].get(k, [0, 0, 0]), G["procs"].get(k, [0, 0, 0])
        if max(a[0], g[0], a[2], g[2]) < 0.5:
            continue
        on = ", ".join(f"{c} {v:.0f}" for c, v in G["ran_on"].get(k, collections.Counter()).most_common())
        lines.append(f"| {k[0]} | {k[1]} | {a[0]:.0f} | {a[1]:.0f} | {a[2]:.0f} | {g[0]:.0f} | {g[1]:.0f} | {g[2]:.0f} | "
                     f"{g[0] - a[0]:+.0f} | {' / '.join(sorted(allowed_of.get(k, {'?'})))} | {on} |")
    tot_a = sum(v[0] for v in A["procs"].values())
    tot_g = sum(v[0] for v in G["procs"].values())
    lines.append(f"| all | this bench's processes | {tot_a:.0f} | | {sum(v[2] for v in A['procs'].values()):.0f} | {tot_g:.0f} | | "
                 f"{sum(v[2] for v in G['procs'].values()):.0f} | {tot_g - tot_a:+.0f} | | |")
    lines += summary(A, G, P, alone, group, len(G["cpus"]))
    lines += ["", "The machine per CPU, ms per step: busy (all processes) / elapsed; busy minus this bench's = other people's work",
              "| cpu | alone: busy / elapsed | group: busy / elapsed |", "|---|---|---|"]
    for c in sorted(G["cpus"]):
        lines.append(f"| {c} | {A['cpus'][c][0]:.0f} / {A['cpus'][c][1]:.0f} | {G['cpus'][c][0]:.0f} / {G['cpus'][c][1]:.0f} |")
    busy_a, busy_g = sum(v[0] for v in A["cpus"].values()), sum(v[0] for v in G["cpus"].values())
    lines.append(f"| others' work (busy − ours) | {busy_a - A['ours']:.0f} | {busy_g - G['ours']:.0f} |")
    lines += ["", f"Threads, CPU ms per step (top {top} by group cpu; 'page i' threads summed over page i's processes)",
              "| owner | process | thread | alone: cpu | wait | group: cpu | wait | group − alone |", "|---|---|---|---|---|---|---|---|"]
    tkeys = sorted(set(A["threads"]) | set(G["threads"]), key=lambda k: -max(G["threads"].get(k, [0])[0], A["threads"].get(k, [0])[0]))
    for k in tkeys[:top]:
        a, g = A["threads"].get(k, [0, 0, 0]), G["threads"].get(k, [0, 0, 0])
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {a[0]:.1f} | {a[2]:.1f} | {g[0]:.1f} | {g[2]:.1f} | {g[0] - a[0]:+.1f} |")
    return "\n".join(lines)


def v8_table(alone: dict, group: dict, top: int) -> str:
    if not alone["profiles"] or not group["profiles"]:
        return "(no V8 profile: the run ended before step --skip)"
    steps = lambda r: max(1.0, r["last_step"][0] - SKIP[0])
    per = [(self_times(p)[0], steps(alone)) for p in alone["profiles"]] + [(self_times(p)[0], steps(group)) for p in group["profiles"]]
    cols = ["alone"] + [f"group page {i}" for i in range(len(group["profiles"]))]
    keys = collections.Counter()
    for ms, n in per:
        for k, v in ms.items():
            keys[k] += v / n
    lines = [f"V8 self time on each page's main thread, ms per step (steps {SKIP[0]}..the last; top {top})",
             "| function | where | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for k, _ in keys.most_common(top):
        lines.append(f"| {k[0]} | {k[1]} | " + " | ".join(f"{ms.get(k, 0) / n:.1f}" for ms, n in per) + " |")
    lines.append("| all sampled | | " + " | ".join(f"{sum(ms.values()) / n:.0f}" for ms, n in per) + " |")
    return "\n".join(lines)


SKIP = [3]


def strkeys(o):
    """tuple keys -> ' / '-joined strings, for JSON"""
    if isinstance(o, dict):
        return {" / ".join(k) if isinstance(k, tuple) else str(k): strkeys(v) for k, v in o.items()}
    return o


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="lan")
    ap.add_argument("--settings", default="large", choices=sorted(SETTINGS))
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=3, help="steps before the window (warm-up)")
    ap.add_argument("--audit-rate", type=float, default=0.0)
    ap.add_argument("--sample-ms", type=int, default=1000, help="the sampler's period (it runs in this process: its own CPU is the bench row)")
    ap.add_argument("--v8", action="store_true", help="also the V8 profile of every page (module docstring)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", default="", help="write the raw accounting here")
    args = ap.parse_args()
    SKIP[0] = args.skip
    settings = SETTINGS[args.settings]
    print(f"cores {len(os.sched_getaffinity(0))}, load {load()}, profile {args.profile}, settings {args.settings} {settings}, "
          f"audits {args.audit_rate}, steps {args.steps} (window from step {args.skip})", flush=True)
    with tempfile.TemporaryDirectory(prefix="daisy-profile-cpu-") as tmp:
        with Netlab([profile(args.profile)] * args.peers) as lab, lab_app(lab, tmp, "cpu") as base, LabPages(lab, base) as pages:
            runs = []
            for P in (1, args.peers):
                r = run_once(lab, pages, base, P, settings, args.steps, args.skip, args.audit_rate, args.sample_ms / 1000, args.v8)
                print(f"P {P}: {r['steps']:.1f} steps in the window, ms/step {r['ms_step']:.0f}, load {load()}", flush=True)
                runs.append(r)
    alone, group = runs
    print()
    print(table(alone, group, args.top))
    if args.v8:
        print()
        print(v8_table(alone, group, args.top))
    print(f"\nload {load()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **{name: {**strkeys(account(r)), "ms_step": r["ms_step"], "steps": r["steps"]}
                                              for name, r in (("alone", alone), ("group", group))}}, f, indent=1)


if __name__ == "__main__":
    main()
