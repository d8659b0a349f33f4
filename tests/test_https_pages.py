"""A room without internet (README "A room without internet"): `python app.py --https`, the real
command with its default host, serves TLS with the self-signed certificate it makes for this
machine's LAN addresses; two headless Chromium pages, each in a network namespace of its own
behind the network lab's `lan` link, open `https://<the lab's address>:PORT`. Page a's browser
trusts that one certificate by its public key's SHA-256 (a device that installed it, or a local
CA's root); page b's does not: it must show its warning, and b proceeds past it as a person does
once the fingerprint checked out. Both pages are secure contexts (and cross-origin isolated:
COOP/COEP hold over TLS), WebGPU is offered, /signal runs over wss://, the pages group, link and
train 30+ steps, every step equal to `python -m daisy.train`; the command printed the lab
address's URL and the certificate's fingerprint.

The lab's address (198.18.N.1) is on a TUN device of this machine's root namespace, so the
certificate names it because app.py found it among the interfaces, as it finds a laptop's Wi-Fi
address. The pages group through a room: the lab gives each namespace its own address of
198.18.0.0/15 (the benchmarking range), which the server rightly counts as two networks, where a
classroom's Wi-Fi gives private addresses that form one group (tests/test_signaling.py
test_loopback_and_private_addresses_share_one_local_group; over wss:// from two addresses of the
local network: tests/test_tls.py); rooms work over TLS as over the internet.
"""
from __future__ import annotations

import base64
import hashlib
import os
import ssl
import tempfile

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.app_server import free_port, start_app, stop_app, wait_state, wait_up
from tests.netlab_pages import LabPages, admit, linked, room_url
from tests.reference import reference_hashes
from tests.test_membership import assert_reference, final_hashes, record
from tests.test_mesh import TINY, ended
from tools.netlab import Netlab, profile

pytestmark = pytest.mark.slow

RUN_MS = 90_000
SETTINGS = {"steps": 10000, **TINY}      # the test stops it
STOP_AT = 30
# every WebSocket the page opens, for the check that /signal is wss://
SOCKETS = """(() => { window.__sockets = []; const Native = window.WebSocket;
    window.WebSocket = class extends Native { constructor(url, p) { super(url, p); window.__sockets.push(String(url)); } }; })()"""
SECURITY = """() => ({ secure: window.isSecureContext, isolated: window.crossOriginIsolated, gpu: 'gpu' in navigator,
    protocol: location.protocol, sockets: window.__sockets })"""


def test_two_lan_pages_over_https_are_secure_contexts_and_train_the_reference():
    with tempfile.TemporaryDirectory(prefix="daisy-https-") as tmp, \
            Netlab([profile("lan"), profile("lan")]) as lab:
        port = free_port()
        tls = os.path.join(tmp, "tls")
        proc, log = start_app(tmp, "https", {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]", "DAISY_TLS_DIR": tls},
                              ["--https", "--port", str(port)])
        base = f"https://{lab.host_addr}:{port}"
        try:
            wait_up(proc, base, os.path.join(tmp, "https.log"), verify=False)
            printed = open(os.path.join(tmp, "https.log")).read()
            cert_pem = open(os.path.join(tls, "cert.pem")).read()
            cert = x509.load_pem_x509_certificate(cert_pem.encode())
            spki = base64.b64encode(hashlib.sha256(cert.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).digest()).decode()
            with LabPages(lab, base, spki=spki) as pages:
                url = room_url(base, "&gpu=off")
                a = pages.open(0, url, "a", init_script=SOCKETS)                     # trusts the key
                wait_state(a, "s.role === 'host'", "room host")
                b = pages.open(1, url, "b", init_script=SOCKETS, past_warning=True)  # proceeds past the warning
                admit(a, b)
                linked(a, [b])
                linked(b, [a])
                security = [p.evaluate(SECURITY) for p in (a, b)]
                for p in (a, b):
                    record(p)
                a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
                wait_state(a, f"s.running && s.step >= {STOP_AT}", f"{STOP_AT} steps over https", RUN_MS)
                a.evaluate("window.daisy.stop()")
                finals = [ended(p, f"{label} stopped", RUN_MS) for p, label in ((a, "a"), (b, "b"))]
                logs = {label: final_hashes(p, label) for p, label in ((a, "a"), (b, "b"))}
                problems = list(pages.problems)
        finally:
            stop_app(proc, log)

    # what the command printed: the lab address's URL, the certificate's fingerprint
    der = ssl.PEM_cert_to_DER_cert(cert_pem)
    fingerprint = ":".join(f"{x:02X}" for x in hashlib.sha256(der).digest())
    assert f"    https://{lab.host_addr}:{port}\n" in printed, printed[:2000]
    assert f"Certificate SHA-256 fingerprint: {fingerprint}" in printed, printed[:2000]
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert lab.host_addr in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}, names
    for s, label in zip(security, "ab"):
        print(label, s)
        assert s["secure"] and s["isolated"] and s["gpu"] and s["protocol"] == "https:", (label, s)
        assert s["sockets"] and all(u.startswith(f"wss://{lab.host_addr}:{port}/signal") for u in s["sockets"]), s
    for s, label in zip(finals, "ab"):
        assert s["runState"] == "stopped" and s["step"] >= STOP_AT, f"{label}: {s['runState']} at {s['step']}: {s['message']}"
    assert len({(s["step"], s["hash"]) for s in finals}) == 1, [(s["step"], s["hash"][:16]) for s in finals]
    want = reference_hashes(SETTINGS, finals[0]["step"])
    for label, got in logs.items():
        assert sorted(got) == list(range(1, finals[0]["step"] + 1)), f"{label}: steps {sorted(got)[:3]}.."
        assert_reference(label, got, want)
    assert not problems, "console errors:\n" + "\n".join(problems)
