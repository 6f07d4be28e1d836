"""The dashboard page in a real browser (Debian's chromium driven by Playwright) while clients
infer: the process list with roles, a model's queue and throughput, plots that grow, a client
shared-memory region, an llm model's tokens/s, latencies and KV blocks.
``SHOAL_DASHBOARD_SCREENSHOT=docs/img/dashboard.png`` also saves the README's screenshot."""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.ops.live import LLM_KV_BLOCKS, Load, build_dashboard_repository, wait_for

T = TypeVar("T")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (the test extra has it)")
if not os.path.exists(CHROMIUM):
    pytest.skip("no chromium at /usr/bin/chromium (apt-get install -y chromium)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = build_dashboard_repository(tmp_path_factory.mktemp("dashboard-browser-repo"),
                                      llm=True)
    with serving(ShoalServer([str(repo)], ["--allow-client-shm=true"])) as srv:
        yield srv


@pytest.fixture
def client_region(server: ShoalServer) -> Iterator[str]:
    """A system shared-memory region registered by a client for the test's length."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    key = f"/dashboard-test-{os.getpid()}"
    handle = shm.create_shared_memory_region("dashboard_input", key, 64 * 1024)
    shm.set_shared_memory_region(handle, [np.zeros(16, dtype=np.float32)])
    client = httpclient.InferenceServerClient(server.url)
    client.register_system_shared_memory("dashboard_input", key, 64 * 1024)
    try:
        yield key
    finally:
        client.unregister_system_shared_memory("dashboard_input")
        client.close()
        shm.destroy_shared_memory_region(handle)


def when(read: Callable[[], T], condition: Callable[[T], bool]) -> Callable[[], T | None]:
    """A probe for ``wait_for``: what ``read`` returns, once ``condition`` holds for it."""
    def probe() -> T | None:
        value = read()
        return value if condition(value) else None

    return probe


def cell_texts(page: Any, table: str) -> list[list[str]]:
    rows: list[list[str]] = page.eval_on_selector_all(
        f"#{table} tbody tr",
        "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent.trim()))")
    return rows


def model_row(page: Any, name: str) -> dict[str, str] | None:
    """The models table's row of ``name`` by column (queue, req/s, ...)."""
    for cells in cell_texts(page, "models"):
        if cells and cells[0] == name:
            return {"state": cells[2], "queue": cells[4], "in_flight": cells[5],
                    "rps": cells[6], "p50_p99": cells[8]}
    return None


def llm_row(page: Any) -> dict[str, str] | None:
    """The LLM table's row of the ``llm`` model by column."""
    for cells in cell_texts(page, "llm"):
        if cells and cells[0] == "llm":
            return {"active": cells[2], "queued": cells[3], "kv_used": cells[4],
                    "kv_free": cells[5], "tokens_s": cells[7], "ttft": cells[9],
                    "itl": cells[10]}
    return None


def test_the_page_shows_processes_models_and_plots_that_move(
        server: ShoalServer, client_region: str, tmp_path: pathlib.Path) -> None:
    errors: list[str] = []
    with sync_api.sync_playwright() as playwright, \
            Load(server.base, clients=3, llm_clients=1) as load:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("console", lambda message: errors.append(message.text)
                    if message.type == "error" else None)
            page.goto(f"http://127.0.0.1:{server.metrics_port}/dashboard")
            page.wait_for_selector("#status.live", timeout=20_000)

            # every process, with its role
            processes = wait_for(when(lambda: cell_texts(page, "processes"),
                                      lambda rows: len(rows) >= 5), what="the process table")
            roles = {cells[0]: cells[1] for cells in processes}
            assert roles["supervisor"] == "supervisor" and roles["broker"] == "broker"
            assert roles["frontend 0"] == "frontend"
            assert roles["mlp v1 mlp_0_0 (cpu)"] == "worker"
            assert roles["sleepy v1 sleepy_0_0 (cpu)"] == "worker"

            # a model's throughput, and the queue in front of the one sleepy instance
            busy = wait_for(when(lambda: model_row(page, "mlp"),
                                 lambda row: row is not None and float(row["rps"]) > 0),
                            what="mlp's requests/s on the page")
            assert busy["state"] == "READY" and "ms" in busy["p50_p99"]
            wait_for(when(lambda: model_row(page, "sleepy"),
                          lambda row: row is not None and int(row["queue"]) > 0),
                     what="a queue on sleepy on the page")

            # the plots grow as samples arrive
            path = '#plots path[data-series="mlp v1"]'
            first = page.get_attribute(path, "d")
            assert first
            wait_for(when(lambda: page.get_attribute(path, "d"),
                          lambda d: bool(d) and d.count("L") > first.count("L")),
                     what="the plot to grow")
            assert page.locator("#plots svg").count() == 6

            # shared memory: arenas and the client's region
            regions = cell_texts(page, "regions")
            assert ["dashboard_input", "system", client_region] == regions[0][:3]
            assert any(cells[1] == "frontend input arena"
                       for cells in cell_texts(page, "segments"))

            # the llm model: generating, with its first-token and inter-token latencies
            llm = wait_for(when(lambda: llm_row(page),
                                lambda row: row is not None and float(row["tokens_s"]) > 0
                                and "ms" in row["ttft"] and "ms" in row["itl"]),
                           what="the llm row with tokens/s and latencies")
            assert page.locator("#llm-panel").is_visible()
            assert int(llm["kv_used"]) + int(llm["kv_free"]) == LLM_KV_BLOCKS

            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if target := os.environ.get("SHOAL_DASHBOARD_SCREENSHOT"):
                shutil.copy(shot, target)
        finally:
            browser.close()
    assert not load.failures, load.failures[:3]
    assert not errors, errors
