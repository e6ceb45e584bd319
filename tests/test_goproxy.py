"""fetch.goproxy: a module's zip from a Go module proxy, accepted only with go.sum's hash.

The proxy here is a local HTTP server (``$GOPROXY`` pointed at it); the hash of the zip below is the
one Go's own ``dirhash.HashZip(..., dirhash.Hash1)`` (golang.org/x/mod) gives for it.
"""

from __future__ import annotations

import http.server
import io
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fetch import goproxy

MODULE, VERSION = "example.com/Mod", "v1.0.0"
FILES = {"go.mod": "module example.com/Mod\n", "a/b.proto": 'syntax = "proto3";\n'}
GO_H1 = "h1:8xo9ZNaZV0tYsobRguchyGvSMyBexBti/cujbkAsSZM="  # Go's dirhash of zipped(FILES)


def zipped(files: dict[str, str], prefix: str = f"{MODULE}@{VERSION}/") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, text in files.items():
            z.writestr(prefix + name, text)
    return out.getvalue()


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, bytes]]:
    """Serves ``served[path]``; 404 for anything else. ``$GOPROXY`` names it after ``direct``'s absence."""
    served: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"not found")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("GOPROXY", f"off,http://127.0.0.1:{server.server_address[1]}/,direct")
    yield served
    server.shutdown()


def test_the_hash_is_gos() -> None:
    assert goproxy.dirhash(zipfile.ZipFile(io.BytesIO(zipped(FILES)))) == GO_H1


def test_escaped_path_fetched_checked_and_unpacked(proxy: dict[str, bytes], tmp_path: Path) -> None:
    proxy["/example.com/!mod/@v/v1.0.0.zip"] = zipped(FILES)
    z = goproxy.fetch_zip(MODULE, VERSION, GO_H1)
    goproxy.unpack(z, MODULE, VERSION, tmp_path / "m")
    assert {
        str(p.relative_to(tmp_path / "m")): p.read_text() for p in (tmp_path / "m").rglob("*") if p.is_file()
    } == FILES


def test_a_changed_file_is_refused(proxy: dict[str, bytes]) -> None:
    proxy["/example.com/!mod/@v/v1.0.0.zip"] = zipped({**FILES, "go.mod": "module example.com/Other\n"})
    with pytest.raises(goproxy.ProxyError, match=r"Mod@v1.0.0 from http://.*: hash h1:.*, expected h1:8xo9"):
        goproxy.fetch_zip(MODULE, VERSION, GO_H1)


def test_missing_module_and_unsafe_paths_are_one_line(proxy: dict[str, bytes], tmp_path: Path) -> None:
    with pytest.raises(goproxy.ProxyError, match=r"cannot fetch example.com/Mod@v1.0.0 from http://.*: Not Found"):
        goproxy.fetch_zip(MODULE, VERSION, GO_H1)
    bad = zipfile.ZipFile(io.BytesIO(zipped({"../x": "y"})))
    with pytest.raises(goproxy.ProxyError, match="unsafe path"):
        goproxy.unpack(bad, MODULE, VERSION, tmp_path / "m")
    assert not (tmp_path / "x").exists()


def test_proxy_url_from_goproxy() -> None:
    assert goproxy.proxy_url({}) == goproxy.DEFAULT_PROXY
    assert goproxy.proxy_url({"GOPROXY": "direct"}) == goproxy.DEFAULT_PROXY
    assert goproxy.proxy_url({"GOPROXY": "https://goproxy.example/|https://other"}) == "https://goproxy.example"
