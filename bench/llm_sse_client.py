"""Closed-loop streaming chat-completion clients for OpenAI-compatible servers, on raw asyncio
streams (no HTTP library), so the load generator costs little of the CPU the servers share.

Each client holds one keep-alive HTTP/1.1 connection and sends its requests one after another.
Every server-sent event that carries text (``choices[0].delta.content`` non-empty) is
time-stamped on arrival: the first is the time to first token, the gaps between them the
inter-token latencies. The generated token count is the server's own
``usage.completion_tokens`` (``stream_options.include_usage``), not the number of events.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.llm_bench import Trace


@dataclass(frozen=True)
class ChatLoad:
    """What every request asks for; ``extra`` holds a server's own fields (e.g. vLLM's
    ``ignore_eos``)."""

    model: str
    max_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    def body(self, prompt: str) -> bytes:
        return orjson.dumps({
            "model": self.model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **self.extra})


class StreamError(RuntimeError):
    pass


async def _read_chunks(reader: asyncio.StreamReader) -> Any:
    """Yield the body chunks of a ``Transfer-Encoding: chunked`` response (after its head)."""
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers are expected
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def _stream_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                      path: str, body: bytes, trace: Trace) -> None:
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                 + body)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    headers = head.lower()
    if b"transfer-encoding: chunked" not in headers:
        length = 0
        for line in headers.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line[15:])
        text = await reader.readexactly(length)
        raise StreamError(f"HTTP {status}, not a stream: {text[:300]!r}")
    if status != 200:
        text = b"".join([chunk async for chunk in _read_chunks(reader)])
        raise StreamError(f"HTTP {status}: {text[:300]!r}")
    pending = b""
    async for chunk in _read_chunks(reader):
        now = time.perf_counter()
        pending += chunk
        *events, pending = pending.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                message = orjson.loads(data)
                if "error" in message:
                    raise StreamError(f"error event: {message['error']}")
                choices = message.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    trace.token_times.append(now)
                usage = message.get("usage")
                if usage:
                    trace.tokens = int(usage["completion_tokens"])


async def _client(host: str, port: int, path: str, load: ChatLoad, prompts: list[str],
                  traces: list[Trace]) -> None:
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    try:
        for prompt in prompts:
            trace = Trace(time.perf_counter())
            await _stream_one(reader, writer, f"{host}:{port}", path, load.body(prompt), trace)
            if not trace.token_times:
                raise StreamError("a response streamed no text")
            traces.append(trace)
    finally:
        writer.close()


async def run_clients(port: int, load: ChatLoad, plans: list[list[str]],
                      host: str = "127.0.0.1",
                      path: str = "/v1/chat/completions") -> list[Trace]:
    """One closed-loop client per plan (its prompts, in order); returns a trace per request."""
    traces: list[Trace] = []
    await asyncio.gather(*(_client(host, port, path, load, prompts, traces)
                           for prompts in plans))
    return traces
