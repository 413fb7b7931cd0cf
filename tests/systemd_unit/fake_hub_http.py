"""A Hugging Face hub on loopback, for the loader unit under a real systemd: the real
huggingface_hub client (HF_ENDPOINT=http://127.0.0.1:PORT) downloads from it over HTTP.

Usage: python3 fake_hub_http.py PORT REPOS.json LOG
REPOS.json maps a repo id to {"sha": <commit>, "files": {path: text}}. Answered (what
huggingface_hub 1.x's snapshot_download asks for a pinned commit, plus repo_info for a
branch): GET /api/models/<repo>/tree/<rev>, GET /api/models/<repo>/revision/<rev>, HEAD and
GET /<repo>/resolve/<rev>/<path>. Anything else is a 404 with X-Error-Code, as the hub does.
Each request is appended to LOG as one JSON line {"method", "path"}. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlsplit


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub(BaseHTTPRequestHandler):
    repos: ClassVar[dict[str, dict]] = {}
    log: Path

    def log_message(self, fmt: str, *args: object) -> None:  # quiet: LOG holds the requests
        pass

    def _record(self) -> None:
        with self.log.open("a") as f:
            f.write(json.dumps({"method": self.command, "path": self.path}) + "\n")

    def _send(self, code: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, obj: object) -> None:
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _missing(self, code: str, head: bool = False) -> None:
        self._send(404, json.dumps({"error": code}).encode(),
                   {"X-Error-Code": code, "Content-Type": "application/json"}, head)

    def _repo(self, parts: list[str]) -> tuple[str, dict, list[str]] | None:
        if len(parts) < 2 or f"{parts[0]}/{parts[1]}" not in self.repos:
            return None
        repo_id = f"{parts[0]}/{parts[1]}"
        return repo_id, self.repos[repo_id], parts[2:]

    def _route(self, head: bool) -> None:
        self._record()
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        api = parts[:2] == ["api", "models"]
        found = self._repo(parts[2:] if api else parts)
        if found is None:
            return self._missing("RepoNotFound", head)
        repo_id, repo, rest = found
        files = {p: t.encode() for p, t in repo["files"].items()}
        if not rest or (rest[1:2] and rest[1] not in (repo["sha"], "main")):
            return self._missing("RevisionNotFound", head)
        if api and rest[0] == "tree":
            return self._json([{"type": "file", "oid": git_oid(d), "size": len(d), "path": p}
                               for p, d in files.items()])
        if api and rest[0] == "revision":
            return self._json({"id": repo_id, "sha": repo["sha"],
                               "siblings": [{"rfilename": p} for p in files]})
        if not api and rest[0] == "resolve" and len(rest) >= 3:
            path = "/".join(rest[2:])
            if path not in files:
                return self._missing("EntryNotFound", head)
            data = files[path]
            return self._send(200, data, {"X-Repo-Commit": repo["sha"],
                                          "ETag": f'"{git_oid(data)}"',
                                          "Content-Type": "application/octet-stream"}, head)
        return self._missing("EntryNotFound", head)

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)


def main(argv: list[str]) -> int:
    port, repos, log = int(argv[0]), Path(argv[1]), Path(argv[2])
    Hub.repos = json.loads(repos.read_text())
    Hub.log = log
    ThreadingHTTPServer(("127.0.0.1", port), Hub).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
