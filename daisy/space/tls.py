"""HTTPS for a room without internet (README "A room without internet"): the certificate that
`python app.py --https` serves, so that a phone or laptop of the LAN opening
`https://<this machine's LAN address>:7860` gets a secure context (WebGPU, WebRTC) with no
Space, tunnel or proxy.

    found = lan_addresses()                                 # this machine's, from its interfaces
    served, host, shown = https_plan("0.0.0.0", None, None, found)     # self-signed, made or reused
    served, host, shown = https_plan("0.0.0.0", "cert.pem", "key.pem", found)  # given, e.g. mkcert's
    print("\\n".join(banner(served, shown, port)))          # URLs to open, the fingerprint
    uvicorn.run(..., host=host, **app.uvicorn_settings(tls=server_context(served)))   # TLS in connguard

The self-signed certificate names this machine's LAN addresses (IP subject alternative names),
its host name (and `<name>.local`, mDNS), `localhost` and 127.0.0.1. It lives in the cache
directory (DAISY_TLS_DIR, default ~/.cache/daisy/tls: `cert.pem`, `key.pem`) and is reused while
it names exactly the addresses and host name of this start, matches its key and has at least
RENEW_DAYS left; otherwise a new key and certificate replace it. The key is written
owner-readable only (0600, in a 0700 directory) and nothing serves that directory: it never
leaves the machine. Bad files, a key that is not the certificate's, an unwritable directory
raise TlsError with what to do.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import os
import re
import socket
import ssl
import sys

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365      # Apple platforms refuse TLS server certificates valid for more than 825 days
RENEW_DAYS = 30       # a certificate with less left is made anew at start
BACKDATE = datetime.timedelta(days=1)   # devices of an offline room may have clocks a little behind
# SIOCGIFADDR: an interface's IPv4 address (struct ifreq; the address at bytes 20..24 on both)
SIOCGIFADDR = {"linux": 0x8915, "darwin": 0xC0206921}


class TlsError(ValueError):
    """A certificate that cannot be served, with the reason and what to do."""


@dataclasses.dataclass(frozen=True)
class ServedCertificate:
    certfile: str
    keyfile: str
    fingerprint: str          # SHA-256 of the certificate (DER), "AB:CD:…", as browsers show it
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    how: str                  # "made now", "reused" (the self-signed one) or "given"


WILDCARDS = ("0.0.0.0", "::", "")
DNS_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")


def https_plan(host: str, certfile: str | None, keyfile: str | None, found, env=os.environ):
    """What `python app.py --https --host HOST` serves, this machine's LAN addresses being `found`
    -> (ServedCertificate, the host to listen on, the addresses to print a URL for). A wildcard
    host serves every LAN address; with none found it listens on 127.0.0.1 only (no other device
    could check a certificate naming none) and prints no address. A given certificate (both
    files or neither) is checked, not made."""
    if host in WILDCARDS:
        shown = found
        host = host if found else "127.0.0.1"
    else:
        shown = [host]
    if (certfile is None) != (keyfile is None):
        raise TlsError("give both --ssl-certfile and --ssl-keyfile (DAISY_SSL_CERTFILE, DAISY_SSL_KEYFILE), or neither")
    if certfile is not None:
        return given_certificate(certfile, keyfile), host, shown
    named = set(found) | ({host} if is_address(host) else set())
    return self_signed(tls_dir(env), sorted(named, key=address_order), socket.gethostname()), host, shown


def address_order(text: str):
    ip = ipaddress.ip_address(text)
    return ip.version, ip


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# ---- this machine's addresses -------------------------------------------------------------------
def lan_addresses() -> list[str]:
    """This machine's IPv4 addresses that other devices could reach: every interface's, less
    loopback, link-local and unspecified ones; sorted. On Linux and macOS from the interfaces
    themselves (an offline room may have no DNS and no default route); elsewhere the addresses
    the host name resolves to."""
    found = set()
    request = SIOCGIFADDR.get(sys.platform)
    if request is not None and hasattr(socket, "if_nameindex"):
        import fcntl
        import struct
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    ifreq = fcntl.ioctl(s.fileno(), request, struct.pack("256s", name.encode()[:15]))
                except OSError:            # an interface without an IPv4 address
                    continue
                found.add(socket.inet_ntoa(ifreq[20:24]))
    else:
        try:
            found = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        except OSError:
            found = set()
    return sorted((a for a in found if reachable(a)), key=address_order)


def reachable(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def names_for(addresses, hostname: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The subject alternative names of the self-signed certificate -> (DNS names, IPs), sorted."""
    dns = {"localhost"}
    hostname = hostname.lower()
    if DNS_NAME.fullmatch(hostname) and hostname != "localhost":   # "My Laptop", "ü": no DNS name
        dns.add(hostname)
        if "." not in hostname:
            dns.add(hostname + ".local")           # mDNS: how a phone may reach a laptop by name
    ips = {"127.0.0.1", *addresses}
    return tuple(sorted(dns)), tuple(sorted(ips, key=address_order))


def tls_dir(env=os.environ) -> str:
    return env.get("DAISY_TLS_DIR") or os.path.expanduser("~/.cache/daisy/tls")


# ---- the self-signed certificate ----------------------------------------------------------------
def self_signed(directory: str, addresses, hostname: str, now: datetime.datetime | None = None) -> ServedCertificate:
    """The certificate of `directory` if it names exactly these addresses and host name, matches
    its key and is valid for RENEW_DAYS more; else a new key and certificate written there."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    dns, ips = names_for(addresses, hostname)
    certfile, keyfile = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    try:
        kept = load_pair(certfile, keyfile, now)
        if names_of(kept) == (dns, ips) and kept.not_valid_after_utc - now > datetime.timedelta(days=RENEW_DAYS):
            with contextlib.suppress(OSError):   # not ours to change: it is served as it is
                os.chmod(keyfile, 0o600)
            return describe(kept, certfile, keyfile, "reused")
    except TlsError:
        pass                                        # none yet, or not one to keep: make it anew
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "DaisyChain-Web (self-signed)")])
    sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        write_private(keyfile, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
        write_private(certfile, cert.public_bytes(serialization.Encoding.PEM))
    except OSError as e:
        raise TlsError(f"cannot write the certificate to {directory}: {e.strerror or e}; "
                       "set DAISY_TLS_DIR to a directory this user may write") from None
    return describe(cert, certfile, keyfile, "made now")


def write_private(path: str, data: bytes) -> None:
    """Write `path` as 0600 from its first byte (a new file, renamed over the old one)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---- a given certificate (or the kept one) ------------------------------------------------------
def given_certificate(certfile: str, keyfile: str, now: datetime.datetime | None = None) -> ServedCertificate:
    """--ssl-certfile/--ssl-keyfile, checked (load_pair)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return describe(load_pair(certfile, keyfile, now), certfile, keyfile, "given")


def load_pair(certfile: str, keyfile: str, now: datetime.datetime) -> x509.Certificate:
    """The certificate of `certfile` (a PEM file's first, a chain's leaf) once both files parse,
    the key of `keyfile` is the certificate's and the certificate is valid now; else TlsError."""
    try:
        with open(certfile, "rb") as f:
            cert_bytes = f.read()
        with open(keyfile, "rb") as f:
            key_bytes = f.read()
    except OSError as e:
        raise TlsError(f"cannot read {e.filename}: {e.strerror or e}") from None
    try:
        cert = x509.load_pem_x509_certificate(cert_bytes)
    except ValueError:
        raise TlsError(f"{certfile} is not a PEM certificate (-----BEGIN CERTIFICATE----- …)") from None
    try:
        key = serialization.load_pem_private_key(key_bytes, password=None)
    except TypeError:
        raise TlsError(f"the key {keyfile} is encrypted: give an unencrypted key (mkcert writes one)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsError(f"{keyfile} is not a PEM private key (-----BEGIN PRIVATE KEY----- …)") from None
    if spki(key.public_key()) != spki(cert.public_key()):
        raise TlsError(f"the key {keyfile} does not match the certificate {certfile}: give the key the "
                       "certificate was made with")
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise TlsError(f"the certificate {certfile} is valid from {cert.not_valid_before_utc:%Y-%m-%d} to "
                       f"{cert.not_valid_after_utc:%Y-%m-%d}, not now ({now:%Y-%m-%d}): make a new one")
    return cert


def spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def names_of(cert: x509.Certificate) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A certificate's subject alternative names -> (DNS names, IPs), sorted as names_for's."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return (), ()
    return (tuple(sorted(sans.get_values_for_type(x509.DNSName))),
            tuple(sorted((str(a) for a in sans.get_values_for_type(x509.IPAddress)), key=address_order)))


def describe(cert: x509.Certificate, certfile: str, keyfile: str, how: str) -> ServedCertificate:
    dns, ips = names_of(cert)
    digest = cert.fingerprint(hashes.SHA256())
    return ServedCertificate(certfile=os.path.abspath(certfile), keyfile=os.path.abspath(keyfile),
                             fingerprint=":".join(f"{b:02X}" for b in digest),
                             dns_names=dns, ip_addresses=ips, how=how)


def server_context(served: ServedCertificate) -> ssl.SSLContext:
    """The server's TLS settings: the standard library's defaults for a server (TLS 1.2 and
    later, its cipher choice), this certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(served.certfile, served.keyfile)
    return context


# ---- what the server says at start --------------------------------------------------------------
def covers(served: ServedCertificate, host: str) -> bool:
    return host in (served.ip_addresses if is_address(host) else served.dns_names)


def banner(served: ServedCertificate, addresses, port: int) -> list[str]:
    """The lines `python app.py --https` prints: where the certificate is, the URL to open on
    the LAN's devices for each address, and the fingerprint a browser's warning can be checked
    against."""
    lines = [f"DaisyChain-Web over HTTPS, certificate {served.certfile} ({served.how})"]
    if addresses:
        lines.append("Open on the devices of this network:")
        for a in addresses:
            note = "" if covers(served, a) else "   (the certificate does not name it: browsers will refuse it)"
            lines.append(f"    https://{f'[{a}]' if ':' in a else a}:{port}{note}")
    else:
        lines.append(f"No LAN address found: serving this machine only, https://localhost:{port}")
    lines.append(f"Certificate SHA-256 fingerprint: {served.fingerprint}")
    if served.how != "given":
        lines.append("Browsers warn that this certificate is self-signed: check that the fingerprint the "
                     "warning's details show is the one above, then proceed (README \"A room without internet\").")
    return lines
