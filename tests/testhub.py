"""A small real Hugging Face Hub for tests: the calls huggingface_hub 2.4 makes when
HfFileSystem + pyarrow.parquet stream a dataset file (DESIGN §5), over real HTTP on 127.0.0.1.

    GET  /api/datasets/{repo}/revision/{rev}          repo info (sha, siblings)
    GET  /api/datasets/{repo}/tree/{rev}[/{path}]     directory listing (?recursive=1)
    POST /api/datasets/{repo}/paths-info/{rev}        info of given paths (form or JSON body)
    GET|HEAD /datasets/{repo}/resolve/{rev}/{file}    file bytes, with Range -> 206

It counts the body bytes served per file (`bytes_served`) and records every request
(`requests`), so a test can prove that only the needed row groups were fetched.
`fail_status` makes every call answer that HTTP status (e.g. 404, 500); `fail_resolve_status`
only the file downloads (listing works, bytes fail: a hub that breaks mid-stream). `delay_s`
delays every answer (a slow or distant hub, e.g. 0.1). `sha` is the commit the revision
resolves to (settable: a branch that moved); the repo answers at the revision name and at `sha`.

Also here: `write_fineweb_shard`, a parquet file in FineWeb-Edu's schema with several row
groups, and `rowgroup_tokens`, the token stream the data route must serve for a row group.

Run standalone (for bench/ or by hand): python tests/testhub.py --port 0 --shards 2
"""
import argparse
import hashlib
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = "HuggingFaceFW/fineweb-edu"
EOT = 256

WORDS = ("the of and to in is was for on that with as by at from his her an were are which "
         "photosynthesis chlorophyll energy light water carbon cell plant leaf root river "
         "mountain history empire trade language number fraction triangle equation teacher "
         "student lesson library museum ocean climate planet orbit gravity atom molecule "
         "élève café naïve über straße 数学 物理 эксперимент").split()

FINEWEB_SCHEMA = pa.schema([
    ("text", pa.string()), ("id", pa.string()), ("dump", pa.string()), ("url", pa.string()),
    ("date", pa.string()), ("file_path", pa.string()), ("language", pa.string()),
    ("language_score", pa.float64()), ("token_count", pa.int64()), ("score", pa.float64()),
    ("int_score", pa.int64()),
])


def fineweb_texts(n_docs: int, seed: int) -> list[str]:
    """Deterministic pseudo-documents (some non-ASCII) of 40..400 words."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        n = int(rng.integers(40, 400))
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), n)]
        docs.append(" ".join(words).capitalize() + ".")
    return docs


def write_fineweb_shard(path: str, n_row_groups: int, rows_per_group: int, seed: int) -> list[list[str]]:
    """Write a FineWeb-Edu-schema parquet file; returns the texts of each row group."""
    groups = []
    with pq.ParquetWriter(path, FINEWEB_SCHEMA, compression="snappy") as writer:
        for g in range(n_row_groups):
            texts = fineweb_texts(rows_per_group, seed * 1000 + g)
            n = len(texts)
            table = pa.table({
                "text": texts,
                "id": [f"<urn:uuid:{seed:04d}-{g:04d}-{i:06d}>" for i in range(n)],
                "dump": ["CC-MAIN-2024-10"] * n,
                "url": [f"https://example.edu/{seed}/{g}/{i}" for i in range(n)],
                "date": ["2024-02-21T00:00:00Z"] * n,
                "file_path": [f"s3://commoncrawl/crawl-data/{seed}-{g}.warc.gz"] * n,
                "language": ["en"] * n,
                "language_score": [0.97] * n,
                "token_count": [len(t) // 4 for t in texts],
                "score": [3.1] * n,
                "int_score": [3] * n,
            }, schema=FINEWEB_SCHEMA)
            writer.write_table(table, row_group_size=n)   # exactly one row group per call
            groups.append(texts)
    return groups


def rowgroup_tokens(texts: list[str]) -> np.ndarray:
    """The reference token stream of a row group: each document's UTF-8 bytes, then EOT."""
    out = []
    for t in texts:
        out.extend(t.encode("utf-8"))
        out.append(EOT)
    return np.array(out, dtype=np.uint16)


class TestHub:
    """Serve `files` ({path_in_repo: bytes}) as dataset `repo` at revision `revision`."""
    __test__ = False          # a helper, not a pytest test class

    def __init__(self, files: dict[str, bytes], repo: str = REPO, revision: str = "main",
                 sha: str | None = None, delay_s: float = 0.0):
        self.files = dict(files)
        self.repo = repo
        self.revision = revision
        self.sha = sha or hashlib.sha1(repr(sorted((p, len(b)) for p, b in files.items())).encode()).hexdigest()
        self.delay_s = delay_s
        self.bytes_served: dict[str, int] = {}
        self.requests: list[tuple[str, str, str]] = []   # (method, path, range header)
        self.fail_status: int | None = None
        self.fail_resolve_status: int | None = None
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, port: int = 0) -> int:
        hub = self

        class Handler(_Handler):
            pass
        Handler.hub = hub
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.port

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def reset_counts(self) -> None:
        with self.lock:
            self.bytes_served.clear()
            self.requests.clear()

    def total_bytes(self) -> int:
        with self.lock:
            return sum(self.bytes_served.values())

    # -- listing helpers --------------------------------------------------------------------
    def entry(self, path: str) -> dict:
        if path in self.files:
            data = self.files[path]
            return {"type": "file", "path": path, "size": len(data),
                    "oid": hashlib.sha1(data).hexdigest(),
                    "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}}
        return {"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0}

    def dirs(self) -> set[str]:
        out = set()
        for p in self.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                out.add("/".join(parts[:i]))
        return out

    def tree(self, base: str, recursive: bool) -> list[dict] | None:
        base = base.strip("/")
        if base and base not in self.dirs():
            return None
        names = sorted(set(self.files) | self.dirs())
        prefix = base + "/" if base else ""
        out = []
        for name in names:
            if not name.startswith(prefix) or name == base:
                continue
            rest = name[len(prefix):]
            if recursive or "/" not in rest:
                out.append(self.entry(name))
        return out


class _Handler(BaseHTTPRequestHandler):
    hub: TestHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):          # keep test output clean
        pass

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json",
              headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers=headers)

    def _not_found(self, what: str, code: str = "EntryNotFound") -> None:
        self._json(404, {"error": f"{what} not found"}, headers={"X-Error-Code": code})

    def _route(self, method: str) -> None:
        hub = self.hub
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        # Read any body first so a keep-alive connection stays in sync whatever we answer.
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else b""
        with hub.lock:
            hub.requests.append((method, path, self.headers.get("Range", "")))
        if hub.delay_s:
            time.sleep(hub.delay_s)
        if hub.fail_status is not None:
            self._json(hub.fail_status, {"error": f"test hub answers {hub.fail_status}"})
            return
        api = f"/api/datasets/{hub.repo}/"
        resolve = f"/datasets/{hub.repo}/resolve/"
        if path.startswith(api):
            kind, _, rest = path[len(api):].partition("/")
            rev, _, sub = rest.partition("/")
            if rev not in (hub.revision, hub.sha):
                self._not_found(f"revision {rev}", "RevisionNotFound")
            elif kind == "revision" and method == "GET":
                self._json(200, {"id": hub.repo, "sha": hub.sha, "private": False, "gated": False,
                                 "disabled": False, "lastModified": "2024-01-01T00:00:00.000Z",
                                 "siblings": [{"rfilename": p} for p in sorted(hub.files)]})
            elif kind == "tree" and method == "GET":
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                listing = hub.tree(sub, recursive)
                if listing is None:
                    self._not_found(f"path {sub}")
                else:
                    self._json(200, listing)
            elif kind == "paths-info" and method == "POST":
                self._json(200, [hub.entry(p) for p in self._posted_paths() if p in hub.files or p in hub.dirs()])
            else:
                self._json(400, {"error": f"unsupported {method} {path}"})
        elif path.startswith(resolve):
            rev, _, file = path[len(resolve):].partition("/")
            if rev not in (hub.revision, hub.sha):
                self._not_found(f"revision {rev}", "RevisionNotFound")
            elif hub.fail_resolve_status is not None:
                self._json(hub.fail_resolve_status, {"error": f"test hub answers {hub.fail_resolve_status}"})
            elif file not in hub.files:
                self._not_found(f"file {file}")
            else:
                self._serve_file(file, head=(method == "HEAD"))
        else:
            self._not_found(f"repository for {path}", "RepoNotFound")

    def _posted_paths(self) -> list[str]:
        raw = self.body.decode()
        if "json" in (self.headers.get("Content-Type") or ""):
            paths = json.loads(raw).get("paths", [])
        else:
            paths = urllib.parse.parse_qs(raw).get("paths", [])
        return [paths] if isinstance(paths, str) else list(paths)

    def _serve_file(self, file: str, head: bool) -> None:
        hub = self.hub
        data = hub.files[file]
        size = len(data)
        headers = {"ETag": '"' + hashlib.sha256(data).hexdigest() + '"', "Accept-Ranges": "bytes",
                   "X-Repo-Commit": hub.sha, "X-Linked-Size": str(size),
                   "X-Linked-Etag": '"' + hashlib.sha256(data).hexdigest() + '"'}
        rng = self.headers.get("Range")
        status, start, end = 200, 0, size            # [start, end)
        if rng:
            unit, _, spec = rng.partition("=")
            a, _, b = spec.partition("-")
            try:
                if unit.strip() != "bytes" or "," in spec:
                    raise ValueError
                if a == "":                              # suffix range: last b bytes
                    start, end = max(0, size - int(b)), size
                else:
                    start, end = int(a), (min(int(b) + 1, size) if b else size)
                if start >= size or start >= end:
                    raise ValueError
            except ValueError:
                self._send(416, b"", headers={"Content-Range": f"bytes */{size}"}, head=head)
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        body = data[start:end]
        if not head:
            with hub.lock:
                hub.bytes_served[file] = hub.bytes_served.get(file, 0) + len(body)
        self._send(status, body, ctype="application/octet-stream", headers=headers, head=head)

    def do_GET(self):
        self._route("GET")

    def do_HEAD(self):
        self._route("HEAD")

    def do_POST(self):
        self._route("POST")


def shard_path(i: int) -> str:
    return f"sample/10BT/{i:03d}_00000.parquet"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--row-groups", type=int, default=6)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--dir", default="/tmp/daisy-testhub")
    ap.add_argument("--delay-ms", type=float, default=0, help="delay every answer (a slow hub)")
    args = ap.parse_args()
    import os
    os.makedirs(args.dir, exist_ok=True)
    files = {}
    for i in range(args.shards):
        local = os.path.join(args.dir, f"{i:03d}.parquet")
        write_fineweb_shard(local, args.row_groups, args.rows, seed=i + 1)
        files[shard_path(i)] = open(local, "rb").read()
    hub = TestHub(files, delay_s=args.delay_ms / 1000)
    hub.start(args.port)
    print(f"test hub on {hub.endpoint}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
