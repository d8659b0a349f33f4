"""`python app.py --https`'s certificate (daisy/space/tls.py; README "A room without internet"):
its names, fingerprint, reuse while the addresses match and renewal when they change, the key's
file mode, the clear errors of a given certificate, the plan with no LAN address, a port in use
a real TLS handshake (uvicorn configured as app.py does, /signal over wss://) verified by
OpenSSL against the certificate, with its host name checked, and `python app.py` stopping with the
reason.

Independent checks: names and fingerprint are read back with the standard library's OpenSSL
(ssl._ssl._test_decode_cert, hashlib over the DER), not with the module under test."""
from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from websockets.asyncio.client import connect

import app
from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.routes import make_app
from daisy.space.tls import (TlsError, banner, given_certificate, https_plan, lan_addresses, self_signed,
                              server_context)
from tests.app_server import REPO_ROOT
from tests.signal_client import serve_in_thread

NOW = datetime.datetime(2026, 12, 5, 8, 0, tzinfo=datetime.timezone.utc)


def decoded(certfile: str) -> dict:
    return ssl._ssl._test_decode_cert(certfile)


def der_sha256(certfile: str) -> str:
    der = ssl.PEM_cert_to_DER_cert(open(certfile).read())
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def test_names_fingerprint_and_key_mode(tmp_path):
    d = tmp_path / "tls"
    served = self_signed(str(d), ["192.168.1.20", "10.0.0.7"], "classroom", NOW)
    assert served.how == "made now"
    sans = decoded(served.certfile)["subjectAltName"]
    assert sorted(sans) == sorted([("DNS", "classroom"), ("DNS", "classroom.local"), ("DNS", "localhost"),
                                   ("IP Address", "10.0.0.7"), ("IP Address", "192.168.1.20"),
                                   ("IP Address", "127.0.0.1")]), sans
    assert served.fingerprint == der_sha256(served.certfile)
    assert stat.S_IMODE(os.stat(served.keyfile).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert [p.name for p in d.iterdir() if p.name.endswith(".tmp")] == []
    # a host name that is no DNS name is left out; an IPv6 address sorts beside IPv4 ones
    odd = self_signed(str(tmp_path / "odd"), ["fd00::20", "192.168.1.20"], "My Laptop", NOW)
    assert (odd.dns_names, odd.ip_addresses) == (("localhost",), ("127.0.0.1", "192.168.1.20", "fd00::20"))
    assert ("IP Address", "FD00:0:0:0:0:0:0:20") in decoded(odd.certfile)["subjectAltName"]


def test_reused_while_the_names_match_and_renewed_when_they_change(tmp_path):
    d = str(tmp_path / "tls")
    first = self_signed(d, ["192.168.1.20"], "classroom", NOW)
    again = self_signed(d, ["192.168.1.20"], "classroom", NOW + datetime.timedelta(days=100))
    assert (again.how, again.fingerprint) == ("reused", first.fingerprint)
    os.chmod(first.keyfile, 0o644)                   # loosened by hand: tightened on reuse
    self_signed(d, ["192.168.1.20"], "classroom", NOW)
    assert stat.S_IMODE(os.stat(first.keyfile).st_mode) == 0o600
    cases = [(["192.168.1.21"], "classroom", NOW, "a new address"),
             (["192.168.1.21", "10.0.0.7"], "classroom", NOW, "one more address"),
             (["192.168.1.21", "10.0.0.7"], "laptop", NOW, "a new host name"),
             (["192.168.1.21", "10.0.0.7"], "laptop", NOW + datetime.timedelta(days=340), "expiring in < 30 days")]
    seen = {first.fingerprint}
    for addresses, hostname, now, why in cases:
        served = self_signed(d, addresses, hostname, now)
        assert served.how == "made now" and served.fingerprint not in seen, why
        assert der_sha256(served.certfile) == served.fingerprint, why
        assert {v for k, v in decoded(served.certfile)["subjectAltName"] if k == "IP Address"} == \
            {"127.0.0.1", *addresses}, why
        seen.add(served.fingerprint)
    # a pair whose halves do not match (two starts writing at once) is made anew, not served
    other = self_signed(str(tmp_path / "other"), ["192.168.1.21", "10.0.0.7"], "laptop", NOW)
    os.replace(other.keyfile, os.path.join(d, "key.pem"))
    assert self_signed(d, ["192.168.1.21", "10.0.0.7"], "laptop", NOW).how == "made now"


def write_pair(tmp_path, name: str, *, days: int = 30, encrypt: bool = False):
    """A certificate and key as another tool (mkcert) would give them -> (certfile, keyfile)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(NOW - datetime.timedelta(days=1))
            .not_valid_after(NOW + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("room.lan")]), critical=False)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = tmp_path / f"{name}.pem", tmp_path / f"{name}-key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    encryption = serialization.BestAvailableEncryption(b"pw") if encrypt else serialization.NoEncryption()
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return str(certfile), str(keyfile)


def test_a_given_certificate_is_checked_with_clear_errors(tmp_path):
    cert, key = write_pair(tmp_path, "given")
    served = given_certificate(cert, key, NOW)
    assert (served.how, served.dns_names, served.fingerprint) == ("given", ("room.lan",), der_sha256(cert))
    other_cert, other_key = write_pair(tmp_path, "other")
    _, locked_key = write_pair(tmp_path, "locked", encrypt=True)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    refused = [((cert, other_key, NOW), f"the key {other_key} does not match the certificate {cert}"),
               ((str(garbage), key, NOW), f"{garbage} is not a PEM certificate"),
               ((cert, str(garbage), NOW), f"{garbage} is not a PEM private key"),
               ((cert, str(tmp_path / "missing.pem"), NOW), "cannot read .*missing.pem: No such file"),
               ((cert, locked_key, NOW), "is encrypted"),
               ((cert, key, NOW + datetime.timedelta(days=31)), "is valid from 2026-12-04 to 2027-01-04, not now")]
    for call, message in refused:
        with pytest.raises(TlsError, match=message):
            given_certificate(*call)
    with pytest.raises(TlsError, match="give both --ssl-certfile and --ssl-keyfile"):
        https_plan("0.0.0.0", cert, None, ["192.168.1.20"])
    # a given certificate that does not name an address: the printed URL says so
    served, _, shown = https_plan("0.0.0.0", cert, key, ["192.168.1.20"])
    lines = banner(served, shown, 7860)
    assert "    https://192.168.1.20:7860   (the certificate does not name it: browsers will refuse it)" in lines


def test_plan_prints_each_lan_address_and_serves_localhost_only_without_one(tmp_path):
    env = {"DAISY_TLS_DIR": str(tmp_path / "tls")}
    served, host, shown = https_plan("0.0.0.0", None, None, ["10.0.0.7", "192.168.1.20"], env)
    assert (host, shown) == ("0.0.0.0", ["10.0.0.7", "192.168.1.20"])
    lines = banner(served, shown, 7860)
    assert [line for line in lines if "https://" in line] == ["    https://10.0.0.7:7860", "    https://192.168.1.20:7860"]
    assert f"Certificate SHA-256 fingerprint: {der_sha256(served.certfile)}" in lines
    served, host, shown = https_plan("0.0.0.0", None, None, [], env)
    assert (host, shown, served.ip_addresses) == ("127.0.0.1", [], ("127.0.0.1",))
    assert "No LAN address found: serving this machine only, https://localhost:7860" in banner(served, shown, 7860)
    # one address asked for: the certificate names it even when it is not found on an interface
    served, host, shown = https_plan("198.18.7.1", None, None, [], env)
    assert (host, shown, served.ip_addresses) == ("198.18.7.1", ["198.18.7.1"], ("127.0.0.1", "198.18.7.1"))
    served, host, shown = https_plan("::1", None, None, ["192.168.1.20"], env)
    assert "    https://[::1]:7860" in banner(served, shown, 7860) and "::1" in served.ip_addresses


def test_lan_addresses_are_this_machines_and_not_loopback():
    found = lan_addresses()
    print("LAN addresses:", found)
    for address in found:
        assert not address.startswith(("127.", "169.254.")), found
        with socket.socket() as s:
            s.bind((address, 0))                     # an address of this machine


def test_port_in_use_and_https_switches_are_clear():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SystemExit, match=f"error: port {port} is in use on 127.0.0.1"):
            app.check_port_free("127.0.0.1", port)
    assert app.parse_args([], env={}).https is False
    assert app.parse_args(["--https"], env={}).https is True
    assert app.parse_args([], env={"DAISY_HTTPS": "1"}).https is True
    assert app.parse_args([], env={"DAISY_HTTPS": "off"}).https is False
    given = app.parse_args([], env={"DAISY_SSL_CERTFILE": "c.pem", "DAISY_SSL_KEYFILE": "k.pem"})
    assert (given.https, given.ssl_certfile, given.ssl_keyfile) == (True, "c.pem", "k.pem")
    with pytest.raises(SystemExit):
        app.parse_args([], env={"DAISY_HTTPS": "maybe"})


def test_signal_over_wss_verifies_against_the_certificate_and_groups_by_the_devices_addresses(tmp_path):
    """uvicorn with app.py's settings and the self-signed certificate; a client that trusts only
    that certificate connects to wss://localhost/signal (OpenSSL checks the chain and the name).
    Two clients from two addresses of the local network (127.0.0.2, 127.0.0.3: the server sees
    the socket's address, as it sees a LAN device's) land in one network group."""
    served = self_signed(str(tmp_path / "tls"), [], "classroom")
    hub = make_app(SignalingHub(SignalingConfig(ping_s=5, grace_s=0.5)))
    settings = app.uvicorn_settings({"DAISY_TRUSTED_PROXIES": "none"}, tls=server_context(served))
    trusting = ssl.create_default_context(cafile=served.certfile)

    async def first(url: str, **kw) -> dict:
        async with connect(url, ssl=trusting, open_timeout=10, **kw) as ws:
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    async def two_devices(url: str) -> list[dict]:
        async with connect(url, ssl=trusting, open_timeout=10, local_addr=("127.0.0.2", 0)) as a, \
                connect(url, ssl=trusting, open_timeout=10, local_addr=("127.0.0.3", 0)) as b:
            return [json.loads(await asyncio.wait_for(ws.recv(), 10)) for ws in (a, b)]

    with serve_in_thread(hub, **settings) as base:
        port = base.rsplit(":", 1)[1]
        for where in ("localhost", "127.0.0.1"):
            assert asyncio.run(first(f"wss://{where}:{port}/signal"))["type"] == "welcome", where
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):   # a name it does not carry
            asyncio.run(first(f"wss://127.0.0.1:{port}/signal", server_hostname="elsewhere.lan"))
        a, b = asyncio.run(two_devices(f"wss://127.0.0.1:{port}/signal"))
    assert a["group"] == b["group"] and a["group"]["kind"] == "network", (a["group"], b["group"])
    assert a["peerId"] in [p["id"] for p in b["peers"]], b["peers"]


def test_connections_that_never_handshake_are_capped_and_timed_out(tmp_path):
    """Over TLS a connection holds its slot from its accept (daisy.space.connguard
    guarded_tls_protocol): 40 silent sockets from one address against a cap of 30 — 10 closed at
    once, the 30 others when the header timeout (3 s) passes without a handshake (uvicorn's own
    TLS held all 40 for asyncio's 60 s); then a client completes its handshake and gets its
    welcome."""
    served = self_signed(str(tmp_path / "tls"), [], "classroom")
    hub = make_app(SignalingHub(SignalingConfig(ping_s=5, grace_s=0.5)))
    env = {"DAISY_TRUSTED_PROXIES": "none", "DAISY_MAX_CONN_PER_ADDR": "30", "DAISY_HEADER_TIMEOUT_S": "3"}
    trusting = ssl.create_default_context(cafile=served.certfile)

    async def welcome(url: str) -> dict:
        async with connect(url, ssl=trusting, open_timeout=10) as ws:
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    with serve_in_thread(hub, **app.uvicorn_settings(env, tls=server_context(served))) as base:
        port = int(base.rsplit(":", 1)[1])
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
        try:
            # the 10 over the cap: closed as they come (the header timeout's 3 s leave a loaded
            # machine room to count them before the 30 others close too)
            deadline = time.monotonic() + 1.5
            while (at_once := sum(closed_by_server(s, 0.01) for s in silent)) < 10 and time.monotonic() < deadline:
                time.sleep(0.1)
            deadline = time.monotonic() + 8          # the 30 others: when 3 s pass without a handshake
            while (later := sum(closed_by_server(s, 0.01) for s in silent)) < 40 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            for s in silent:
                s.close()
        assert (at_once, later) == (10, 40), (at_once, later)
        assert asyncio.run(welcome(f"wss://localhost:{port}/signal"))["type"] == "welcome"


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """The server closed `sock` (EOF or reset) within within_s."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def test_the_command_stops_with_the_reason(tmp_path):
    """`python app.py` itself: a port in use, a certificate and a key that do not belong together."""
    cert, _ = write_pair(tmp_path, "given")
    _, other_key = write_pair(tmp_path, "other")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("DAISY_", "HF_"))},
           "DAISY_TLS_DIR": str(tmp_path / "tls"), "HF_HUB_OFFLINE": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        runs = [(["--https", "--host", "127.0.0.1", "--port", str(port)], f"error: port {port} is in use on 127.0.0.1"),
                (["--ssl-certfile", cert, "--ssl-keyfile", other_key, "--port", str(port)],
                 f"error: the key {other_key} does not match the certificate {cert}")]
        for args, message in runs:
            out = subprocess.run([sys.executable, "app.py", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 1 and message in out.stderr, (args, out.returncode, out.stderr[-2000:])
