"""kiln.core.storage: what counts as a store's URL, credentials kept out of URLs, and reads that survive
a connection dropping mid-object (a web server on localhost that cuts range responses short)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from kiln.core import storage
from kiln.core.errors import FatalError

BODY = b"".join(b'{"text": "line %d of an object read in ranges"}\n' % i for i in range(400_000))  # ~20 MB


class Flaky(http.server.BaseHTTPRequestHandler):
    """Serves BODY with range requests; a range that does not start at 0 is cut in half while `drops` lasts."""

    protocol_version = "HTTP/1.1"
    drops = 0

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        start, end = 0, len(BODY)
        if ranged := self.headers.get("Range"):
            first, last = ranged.split("=")[1].split("-")
            start, end = int(first), int(last) + 1 if last else len(BODY)
        part = BODY[start:end]
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(len(part)))
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(BODY)}")
        self.end_headers()
        if start and Flaky.drops:
            Flaky.drops -= 1
            self.wfile.write(part[: len(part) // 2])
            self.close_connection = True
            return
        self.wfile.write(part)


@pytest.fixture
def url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/object.jsonl"
    finally:
        server.shutdown()


def read_in_steps(location: str) -> bytes:
    with storage.open_read(location) as f:
        return b"".join(iter(lambda: f.read(1 << 20), b""))


def test_a_dropped_read_goes_on_where_it_stopped(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RETRY_WAIT_S", 0.01)
    Flaky.drops = 2
    before = storage.traffic_since()
    assert read_in_steps(url) == BODY and Flaky.drops == 0
    counted = storage.traffic_since(before)["http"]
    assert counted["reopened"] == 2 and counted["bytes_read"] == len(BODY)  # what the run's manifest reports
    assert storage.describe_traffic({"http": counted})[0].endswith(", 2 retries")


def test_a_connection_that_keeps_dropping_is_named_with_the_offset(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RETRY_WAIT_S", 0.01)
    Flaky.drops = 1000
    with pytest.raises(FatalError, match=rf"{url}: the connection failed 5 times reading at byte [\d,]+"):
        read_in_steps(url)
    Flaky.drops = 0


def test_urls_and_credentials() -> None:
    assert storage.is_url("s3://bucket/key") and storage.is_url("HF://datasets/x") and storage.is_url("https://a/b")
    assert not storage.is_url("data/file.jsonl") and not storage.is_url("/tmp/s3://odd")
    with pytest.raises(FatalError, match="a URL with credentials in it"):
        storage.filesystem("s3://KEY:SECRET@bucket/key")
