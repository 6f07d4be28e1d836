"""String correlation ids (``sequence_id``) as Triton 2.51 bounds them, for every path a
request can come in by (the HTTP and gRPC codecs, and the sequence batcher for BLS and ensemble
requests): at most ``MAX_STRING_BYTES`` bytes of UTF-8, else UNSUPPORTED (501) for any model."""

from __future__ import annotations

from typing import Final

MAX_STRING_BYTES: Final = 128


def too_long_message(correlation_id: str) -> str | None:
    """Triton's message when ``correlation_id`` is over the limit, else None."""
    if len(correlation_id.encode()) > MAX_STRING_BYTES:
        return f"string correlation ID cannot be longer than {MAX_STRING_BYTES} characters"
    return None
