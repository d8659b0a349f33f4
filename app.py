"""DaisyChain-Web: `python app.py` serves the Space (page, signaling, data) with uvicorn.

Host: --host, else $HOST, else $GRADIO_SERVER_NAME, else 0.0.0.0.
Port: --port, else $PORT, else $GRADIO_SERVER_PORT, else 7860 (the Space's port).
HTTPS: --https ($DAISY_HTTPS=1) with a self-signed certificate of this machine's LAN addresses,
or --ssl-certfile/--ssl-keyfile ($DAISY_SSL_CERTFILE/$DAISY_SSL_KEYFILE) with a given one
(daisy/space/tls.py; README "A room without internet").
"""
import argparse
import errno
import logging
import os
import resource
import socket
import sys

import uvicorn

# Gradio's usage analytics would phone home on a machine that may have no network at all.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
from daisy.space.server import create_app  # noqa: E402  (after the environment default above)
from daisy.space.connguard import (ConnectionGuard, guarded_protocol, guarded_tls_protocol,  # noqa: E402
                                   guarded_ws_protocol)
from daisy.space.addresses import trusted_proxies_from_env  # noqa: E402
from daisy.space.signaling.config import SignalingConfig  # noqa: E402
from daisy.space.env import env_flag  # noqa: E402
from daisy.space.tls import TlsError, banner, https_plan, lan_addresses, server_context  # noqa: E402
from uvicorn.protocols.http.auto import AutoHTTPProtocol  # noqa: E402
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol  # noqa: E402

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 7860


def _env_port(env) -> int:
    for name in ("PORT", "GRADIO_SERVER_PORT"):
        raw = env.get(name)
        if raw not in (None, ""):
            if not raw.isdigit() or not 0 < int(raw) < 65536:
                raise SystemExit(f"error: {name}={raw!r} is not a port number (1-65535)")
            return int(raw)
    return DEFAULT_PORT


def parse_args(argv, env=os.environ):
    ap = argparse.ArgumentParser(description="Serve DaisyChain-Web: the page, /signal and /data.")
    ap.add_argument("--host", default=env.get("HOST") or env.get("GRADIO_SERVER_NAME") or DEFAULT_HOST,
                    help="address to listen on (default: $HOST, $GRADIO_SERVER_NAME or 0.0.0.0)")
    ap.add_argument("--port", type=int, default=None,
                    help="port (default: $PORT, $GRADIO_SERVER_PORT or 7860)")
    ap.add_argument("--https", action="store_true", default=None,
                    help="serve HTTPS with a self-signed certificate of this machine's LAN addresses "
                         "(default: $DAISY_HTTPS)")
    ap.add_argument("--ssl-certfile", default=env.get("DAISY_SSL_CERTFILE") or None,
                    help="serve HTTPS with this certificate (PEM) instead (default: $DAISY_SSL_CERTFILE)")
    ap.add_argument("--ssl-keyfile", default=env.get("DAISY_SSL_KEYFILE") or None,
                    help="the certificate's key (PEM) (default: $DAISY_SSL_KEYFILE)")
    args = ap.parse_args(argv)
    if args.port is None:
        args.port = _env_port(env)
    elif not 0 < args.port < 65536:
        ap.error(f"--port must be in 1..65535, got {args.port}")
    try:
        args.https = bool(args.https or env_flag(env, "DAISY_HTTPS") or args.ssl_certfile or args.ssl_keyfile)
    except ValueError as e:
        ap.error(str(e))
    return args


def check_port_free(host: str, port: int) -> None:
    """Refuse to start, saying so, when HOST:PORT cannot be listened on (uvicorn's own message
    is a logged errno)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, where = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as uvicorn's socket
            s.bind(where)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise SystemExit(f"error: port {port} is in use on {host} (another `python app.py`?): stop "
                             "it, or choose another port with --port or $PORT") from None
        raise SystemExit(f"error: cannot listen on {host}:{port}: {e.strerror or e}") from None


def raise_file_limit() -> None:
    """Soft open-file limit up to the hard one: every connection is a descriptor, and the
    connection cap (daisy.space.connguard) is clamped below this limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    raise_file_limit()
    host, tls = args.host, None
    said = [f"DaisyChain-Web on http://{'localhost' if host == '0.0.0.0' else host}:{args.port}"]
    if args.https:
        try:
            served, host, shown = https_plan(args.host, args.ssl_certfile, args.ssl_keyfile, lan_addresses())
        except TlsError as e:
            raise SystemExit(f"error: {e}") from None
        tls = server_context(served)
        logging.getLogger("uvicorn.error").addFilter(StartLineScheme())
        said = banner(served, shown, args.port)     # the URLs to open, the fingerprint
    check_port_free(host, args.port)
    print("\n".join(said), flush=True)
    uvicorn.run(create_app(), host=host, port=args.port, log_level="info", **uvicorn_settings(tls=tls))


class StartLineScheme(logging.Filter):
    """uvicorn's "Uvicorn running on http://…" names the scheme of uvicorn's own TLS, which
    --https leaves unused (the connection guard does the handshakes): it says https."""

    def filter(self, record) -> bool:
        if str(record.msg).startswith("Uvicorn running on") and record.args and record.args[0] == "http":
            record.args = ("https", *record.args[1:])
        return True


def uvicorn_settings(env=os.environ, tls=None) -> dict:
    """uvicorn options of the Space (limits: docs/TROUBLESHOOTING.md, "Connection limits").
    X-Forwarded-For is believed only from the proxies of DAISY_TRUSTED_PROXIES (README "Serving
    over HTTPS"), the same list signaling uses: never "*", which let any client choose its
    network group. Raw connections get a header timeout and caps (daisy.space.connguard); WebSocket
    messages are refused past the signaling frame limit before they are buffered or inflated.
    tls: an ssl.SSLContext for HTTPS, its handshakes under the same timeout and caps."""
    trusted = trusted_proxies_from_env(env)
    guard = ConnectionGuard.from_env(env, trusted=trusted)
    http = guarded_protocol(AutoHTTPProtocol, guard)
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": ",".join(trusted) or None,
            "http": guarded_tls_protocol(http, guard, tls) if tls is not None else http,
            "ws": guarded_ws_protocol(AutoWebSocketsProtocol, guard),
            "timeout_keep_alive": 5,                # idle keep-alive connections
            "h11_max_incomplete_event_size": 16 * 1024,   # request line + headers
            "limit_concurrency": guard.total,       # HTTP requests beyond it get 503
            "ws_max_size": SignalingConfig().max_frame,   # 64 KiB, as /signal allows
            "ws_max_queue": 8}                      # unread messages per socket


if __name__ == "__main__":
    main()
