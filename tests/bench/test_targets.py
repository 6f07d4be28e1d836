"""Issue #16's targets as make bench computes them (bench/targets.py)."""

from __future__ import annotations

from typing import Any

from bench.targets import realistic_targets


def cell(rate: float, p50: float, p99: float) -> dict[str, Any]:
    return {"requests_per_s": rate, "p50_ms": p50, "p99_ms": p99, "errors": 0}


SHOAL = {"json/c64": cell(6000, 9.0, 20.0), "binary/c64": cell(7000, 8.0, 18.0),
         "json/c1": cell(500, 1.5, 3.0), "grpc/c64": cell(4000, 14.0, 30.0),
         "binary/c256": cell(9000, 25.0, 60.0)}
MLSERVER = {"json/c64": cell(1000, 50.0, 200.0), "json/c1": cell(400, 2.0, 4.0),
            "grpc/c64": cell(1000, 55.0, 150.0)}


def test_each_target_is_met_or_missed_from_its_cells() -> None:
    targets = realistic_targets(SHOAL, MLSERVER, {"batch32_rows_per_s": 20000.0})
    assert [t.met for t in targets] == [True, True, False, False, False, True]
    assert targets[0].measured.startswith("6.00")
    assert targets[5].measured.startswith("45%")


def test_a_cell_not_measured_says_so() -> None:
    targets = realistic_targets(SHOAL, {}, {})
    assert all(t.met is None for t in targets)
    assert targets[0].line().startswith("- **not measured**")
