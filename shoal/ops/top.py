"""``shoal top``: the ops dashboard in a terminal. Polls ``GET <url>/dashboard/api/stats``
every ``--interval`` seconds and draws a ``rich`` Live view (models, processes, shared memory,
with sparklines of the last minute); ``--once`` prints one frame and exits.

Exit codes: 0 after ``--once`` or Ctrl-C; 1 when the first poll fails (server unreachable,
dashboard restricted, not a shoal dashboard), with one line on stderr saying why. Later failures
keep the last frame on screen, marked disconnected, and polling goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from shoal.ops.schema import SCHEMA_VERSION, HistoryDocument, StatsDocument

TREND_POINTS: Final = 40
_BLOCKS: Final = "▁▂▃▄▅▆▇█"
NONE: Final = "-"  # a figure that is not known
_STATE_STYLES: Final = {"READY": "green", "LOADING": "yellow", "UNLOADING": "yellow"}


class TopError(Exception):
    """A poll failed; the message is for the user."""


class DashboardClient:
    """GETs the dashboard API with the user's headers."""

    def __init__(self, url: str, headers: Sequence[tuple[str, str]], timeout_s: float) -> None:
        self.base = url.rstrip("/")
        self.headers = dict(headers)
        self.timeout_s = timeout_s

    def _get(self, path: str) -> bytes:
        url = self.base + path
        request = urllib.request.Request(url, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                body: bytes = reply.read()
                return body
        except urllib.error.HTTPError as exc:
            detail = _error_text(exc.read())
            if exc.code in (401, 403):
                raise TopError(
                    f"the dashboard at {self.base} is restricted ({exc.code}: {detail}); "
                    "pass the header it needs with --header KEY=VALUE") from None
            if exc.code == 404 or exc.code == 400:
                raise TopError(f"{url} answered {exc.code}: is this a shoal metrics port "
                               "(--metrics-port, default 8002)?") from None
            raise TopError(f"{url} answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TopError(f"cannot reach {self.base}: {reason} (is `shoal serve` running "
                           "with --allow-metrics on this port?)") from None

    def stats(self) -> StatsDocument:
        body = self._get("/dashboard/api/stats")
        try:
            return msgspec.json.decode(body, type=StatsDocument)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise TopError(f"{self.base}/dashboard/api/stats is not a shoal dashboard "
                           f"document of schema {SCHEMA_VERSION}: {exc}") from None

    def history(self, seconds: int) -> HistoryDocument | None:
        """The server's recent history to start the trends with (None if unavailable)."""
        try:
            body = self._get(f"/dashboard/api/history?seconds={seconds}")
            return msgspec.json.decode(body, type=HistoryDocument)
        except (TopError, msgspec.DecodeError, msgspec.ValidationError):
            return None


def _error_text(body: bytes) -> str:
    try:
        document = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace").strip() or "no details"
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return str(document["error"])
    return body[:200].decode(errors="replace")


# ------------------------------------------------------------------ trends


class Trends:
    """The last TREND_POINTS values per series, kept by the client between polls."""

    def __init__(self) -> None:
        self.series: dict[str, deque[float | None]] = {}
        self._last_time = 0.0

    def _push(self, key: str, value: float | None) -> None:
        self.series.setdefault(key, deque(maxlen=TREND_POINTS)).append(value)

    def seed(self, history: HistoryDocument | None) -> None:
        if history is None:
            return
        for key, process in history.processes.items():
            for cpu, rss in zip(process.cpu_percent, process.rss_bytes, strict=True):
                self._push(f"cpu {key}", cpu)
                self._push(f"rss {key}", None if rss is None else float(rss))
        for key, model in history.models.items():
            for rps in model.requests_per_s:
                self._push(f"rps {key}", rps)
        if history.time:
            self._last_time = history.time[-1]

    def add(self, document: StatsDocument) -> None:
        if document.time <= self._last_time:
            return  # the same sample polled twice
        self._last_time = document.time
        for process in document.processes:
            self._push(f"cpu {process.key}", process.cpu_percent)
            self._push(f"rss {process.key}", float(process.rss_bytes))
        for model in document.models:
            self._push(f"rps {model.name}:{model.version}", model.requests_per_s)

    def spark(self, key: str, floor: float = 0.0, width: int = 16) -> str:
        return sparkline(list(self.series.get(key, ()))[-width:], floor)


def sparkline(values: Sequence[float | None], floor: float = 0.0) -> str:
    """One block character per value, scaled to the largest (at least ``floor``, so that
    noise near zero stays low); a gap is a space."""
    known = [v for v in values if v is not None]
    top = max([*known, floor])
    if top <= 0:
        return "".join(" " if v is None else _BLOCKS[0] for v in values)
    return "".join(" " if v is None else _BLOCKS[min(7, int(v / top * 7.999))] for v in values)


# ------------------------------------------------------------------ rendering


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_us(us: float | None) -> str:
    if us is None:
        return NONE
    if us >= 100_000:
        return f"{us / 1e6:.2f}s"
    return f"{us / 1000:.2f}ms" if us < 10_000 else f"{us / 1000:.1f}ms"


def human_duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def _models_table(document: StatsDocument, trends: Trends) -> Table:
    table = Table(title="models", title_justify="left", expand=False, pad_edge=False)
    for name, justify in (("model", "left"), ("ver", "right"), ("state", "left"),
                          ("inst", "right"), ("queue", "right"), ("in flight", "right"),
                          ("req/s", "right"), ("trend", "left"), ("p50/p99", "right"),
                          ("queue p99", "right"), ("compute p99", "right"), ("err", "right"),
                          ("rej", "right"), ("batch sizes (recent)", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for m in document.models:
        lat = m.latency
        errors = m.fail_count - m.rejections
        batches = " ".join(f"{b.batch_size}:{b.recent}" for b in m.batch_sizes if b.recent)
        table.add_row(
            m.name, str(m.version), Text(m.state, style=_STATE_STYLES.get(m.state, "red")),
            str(m.instances), str(m.queue_depth), str(m.in_flight), f"{m.requests_per_s:.1f}",
            Text(trends.spark(f"rps {m.name}:{m.version}", 1.0), style="cyan"),
            f"{human_us(lat.request_p50_us)}/{human_us(lat.request_p99_us)}",
            human_us(lat.queue_p99_us), human_us(lat.compute_p99_us),
            Text(str(errors), style="red" if errors else ""),
            Text(str(m.rejections), style="red" if m.rejections else ""), batches or NONE)
    if not document.models:
        table.add_row("no models", *[""] * 13)
    return table


def _processes_table(document: StatsDocument, trends: Trends) -> Table:
    table = Table(title="processes", title_justify="left", pad_edge=False)
    for name, justify in (("process", "left"), ("role", "left"), ("pid", "right"),
                          ("cpu%", "right"), ("cpu trend", "left"), ("rss", "right"),
                          ("rss trend", "left"), ("thr", "right"), ("fds", "right"),
                          ("up", "right"), ("rst", "right"), ("shm", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for p in document.processes:
        table.add_row(
            p.label, p.role, str(p.pid), f"{p.cpu_percent:.1f}",
            Text(trends.spark(f"cpu {p.key}", 10.0), style="green"), human_bytes(p.rss_bytes),
            Text(trends.spark(f"rss {p.key}"), style="magenta"), str(p.threads),
            str(p.open_fds), human_duration(p.uptime_s),
            Text(str(p.restarts), style="red" if p.restarts else ""),
            human_bytes(p.shm_bytes) if p.shm_bytes else NONE)
    return table


def _memory_lines(document: StatsDocument) -> Iterable[RenderableType]:
    shm = document.shared_memory
    yield Text(f"shared memory: {human_bytes(shm.total_bytes)} in server segments "
               f"({human_bytes(shm.total_resident_bytes)} resident), "
               f"{len(shm.client_regions)} client region(s)"
               + "".join(f"; {r.name} ({r.kind}{' ' + r.key if r.key else ''}) "
                         f"{human_bytes(r.byte_size)}" for r in shm.client_regions[:4]))
    for device in document.devices:
        limit = human_bytes(device.limit_bytes) if device.limit_bytes is not None else "unknown"
        held = ", ".join(f"{h.model} {h.part} {human_bytes(h.bytes)}" for h in device.holders)
        yield Text(f"GPU {device.device} ledger: {human_bytes(device.reserved_bytes)} reserved "
                   f"of {limit}" + (f" ({held})" if held else ""))
    if document.llm:
        table = Table(title="LLM", title_justify="left", pad_edge=False)
        for name in ("model", "ver", "active", "queued", "KV used", "KV free", "reused",
                     "tokens/s", "TTFT p50/p99", "ITL p50/p99"):
            table.add_column(name, no_wrap=True)
        for m in document.llm:
            table.add_row(m.name, str(m.version), str(m.active_requests),
                          str(m.queued_requests), str(m.kv_blocks_used), str(m.kv_blocks_free),
                          str(m.kv_blocks_reused), f"{m.tokens_per_s:.1f}",
                          f"{human_us(m.ttft_p50_us)}/{human_us(m.ttft_p99_us)}",
                          f"{human_us(m.itl_p50_us)}/{human_us(m.itl_p99_us)}")
        yield table


def render(document: StatsDocument, trends: Trends, url: str,
           problem: str | None = None) -> RenderableType:
    """One frame. ``problem``: why the latest poll failed (the frame is the last good one)."""
    server = document.server
    stamp = time.strftime("%H:%M:%S", time.localtime(document.time))
    head = Text.assemble(("shoal top ", "bold"), f"{url} · instance {server.instance_id} · ",
                         ("ready" if server.ready else "not ready",
                          "green" if server.ready else "red"),
                         " · exiting" if server.exiting else "",
                         f" · {stamp} · sample {document.sample_ms:.1f} ms "
                         f"({document.sample_cpu_ms:.1f} ms CPU)")
    parts: list[RenderableType] = [head]
    if problem:
        parts.append(Text(f"disconnected: {problem} (retrying)", style="bold red"))
    parts.extend(Text(e, style="red") for e in document.errors)
    parts += [_models_table(document, trends), _processes_table(document, trends),
              *_memory_lines(document)]
    return Group(*parts)


# ------------------------------------------------------------------ entry


def run_top(args: argparse.Namespace, console: Console | None = None) -> int:
    out = console or Console()
    client = DashboardClient(args.url, args.header, args.timeout)
    trends = Trends()
    try:
        document = client.stats()
    except TopError as exc:
        print(f"shoal top: {exc}", file=sys.stderr)
        return 1
    trends.seed(client.history(TREND_POINTS))
    trends.add(document)
    if args.once:
        out.print(render(document, trends, client.base))
        return 0
    try:
        with Live(render(document, trends, client.base), console=out, screen=True,
                  auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                problem = None
                try:
                    document = client.stats()
                    trends.add(document)
                except TopError as exc:
                    problem = str(exc)
                live.update(render(document, trends, client.base, problem), refresh=True)
    except KeyboardInterrupt:
        return 0
