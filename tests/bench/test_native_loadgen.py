"""bench/native_loadgen.py: what wrk sends, and how h2load's figures are read (errors included)."""

from __future__ import annotations

import http.server
import pathlib
import shutil
import threading

import pytest

from bench import native_loadgen

H2LOAD_OUTPUT = """starting benchmark...
finished in 2.00s, 2.00 req/s, 0.10KB/s
requests: 4 total, 4 started, 4 done, 4 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 3 2xx, 0 3xx, 0 4xx, 1 5xx
traffic: 1.00KB (1000) total, 100B (100) headers (space savings 90.00%), 210B (210) data
"""


def test_h2load_figures_count_answers_without_their_message_as_errors() -> None:
    # 3 answers with HTTP 2xx, but DATA for two messages of 100 bytes (+5 framing): one 2xx
    # answer was a gRPC error (trailers only); one answer was a 5xx
    log = "1\t200\t1000\n2\t200\t3000\n3\t200\t2000\n4\t503\t500\n"
    figures = native_loadgen.h2load_figures(H2LOAD_OUTPUT, log, answer_size=100, concurrency=4)
    assert figures["errors"] == 2
    assert figures["requests_per_s"] == pytest.approx(2 / 2.0)
    assert figures["p50_ms"] == pytest.approx(2.0)
    assert figures["p99_ms"] == pytest.approx(3.0)


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, dict(self.headers), body))
        status = 200 if body == b"\x01binary body" else 400
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (a bench tool)")
def test_wrk_sends_the_body_and_headers_and_counts_bad_answers(tmp_path: pathlib.Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        good = tmp_path / "good.bin"
        good.write_bytes(b"\x01binary body")
        port = server.server_address[1]
        figures = native_loadgen.http(port, "/v2/models/m/infer",
                                      (good, ["Inference-Header-Content-Length: 1"]), 2, 1)
        assert figures["errors"] == 0 and figures["requests_per_s"] > 0
        path, headers, body = _Recorder.seen[0]
        assert (path, body) == ("/v2/models/m/infer", b"\x01binary body")
        assert headers["Content-Type"] == "application/octet-stream"
        assert headers["Inference-Header-Content-Length"] == "1"
        bad = tmp_path / "bad.json"
        bad.write_text('{"inputs": []}')
        figures = native_loadgen.http(port, "/v2/models/m/infer", (bad, []), 1, 1)
        assert figures["errors"] > 0 and figures["requests_per_s"] == 0
        assert _Recorder.seen[-1][1]["Content-Type"] == "application/json"
    finally:
        server.shutdown()
        server.server_close()
