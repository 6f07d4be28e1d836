"""Request decompression (bounded) and response encoding negotiation."""

from __future__ import annotations

import gzip
import zlib

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.http.compression import (
    compress,
    decompress,
    request_encoding,
    response_encoding,
)
from shoal.frontend.http.errors import ShoalHTTPError

PAYLOAD = b'{"inputs": []}' * 100


def test_gzip_and_deflate_bodies_are_inflated() -> None:
    assert decompress(gzip.compress(PAYLOAD), "gzip", 1 << 20) == PAYLOAD
    assert decompress(zlib.compress(PAYLOAD), "deflate", 1 << 20) == PAYLOAD


def test_concatenated_gzip_members_are_one_body() -> None:
    body = gzip.compress(b"abc") + gzip.compress(b"def")
    assert decompress(body, "gzip", 100) == b"abcdef"


def test_a_compression_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB of zeros, ~64 KiB compressed
    with pytest.raises(ShoalError) as info:
        decompress(bomb, "gzip", 1 << 20)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "exceeds the maximum allowed value of 1048576 bytes" in info.value.message


def test_output_exactly_at_the_limit_is_fine() -> None:
    assert len(decompress(gzip.compress(b"x" * 1000), "gzip", 1000)) == 1000


# mtime=0: a gzip header stamps the time, and a test id that changes between pytest-xdist's
# collections stops the run ("Different tests were collected")
@pytest.mark.parametrize("body", [b"not compressed at all",
                                  gzip.compress(PAYLOAD, mtime=0)[:-12], b""])
def test_corrupt_or_truncated_bodies_are_client_errors(body: bytes) -> None:
    with pytest.raises(ShoalError) as info:
        decompress(body, "gzip", 1 << 20)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "failed to decompress the request body" in info.value.message


def test_request_encodings() -> None:
    assert request_encoding(None) is None
    assert request_encoding("identity") is None
    assert request_encoding("gzip") == "gzip"
    assert request_encoding("Deflate") == "deflate"


def test_unknown_request_encoding_is_unsupported_with_accept_encoding() -> None:
    with pytest.raises(ShoalHTTPError) as info:
        request_encoding("br")
    assert info.value.code is ErrorCode.UNSUPPORTED
    assert info.value.headers == {"Accept-Encoding": "gzip, deflate"}


@pytest.mark.parametrize("header,expected", [
    (None, None), ("", None), ("identity", None), ("gzip", "gzip"), ("deflate", "deflate"),
    ("gzip, deflate", "gzip"), ("deflate, gzip", "deflate"),
    ("gzip;q=0.5, deflate;q=0.8", "deflate"), ("br, gzip;q=0.1", "gzip"),
    ("gzip;q=0", None), ("identity;q=1, gzip;q=0.9", None), ("gzip;q=abc", None),
])
def test_response_encoding_follows_q_values(header: str | None, expected: str | None) -> None:
    assert response_encoding(header) == expected


def test_compressed_responses_round_trip() -> None:
    assert gzip.decompress(compress(PAYLOAD, "gzip")) == PAYLOAD
    assert zlib.decompress(compress(PAYLOAD, "deflate")) == PAYLOAD
