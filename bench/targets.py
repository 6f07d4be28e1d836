# ruff: noqa: RUF001  (the targets are typeset: en dashes and multiplication signs)
"""Issue #16's targets for the realistic model, computed from one run's cells (ratios within
the run; absolute numbers are noise on a shared machine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Cells = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Target:
    goal: str
    measured: str
    met: bool | None  # None: a cell it needs was not measured

    def line(self) -> str:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        return f"- **{verdict}** — {self.goal}: {self.measured}"


def _ratio_target(goal: str, num: dict[str, Any] | None, den: dict[str, Any] | None,
                  field: str, at_least: float | None = None, at_most: float | None = None,
                  ) -> Target:
    if not num or not den or not den.get(field):
        return Target(goal, "–", None)
    ratio = num[field] / den[field]
    met = ratio >= at_least if at_least is not None else ratio <= (at_most or 0.0)
    return Target(goal, f"{ratio:.2f}× ({num[field]:,.1f} vs {den[field]:,.1f})", met)


def realistic_targets(shoal: Cells, mlserver: Cells, inprocess: dict[str, float]
                      ) -> list[Target]:
    """The six targets of the issue's "Targets" section, in its order."""
    limit = inprocess.get("batch32_rows_per_s")
    b256 = shoal.get("binary/c256")
    share = Target("binary c=256 ≥ 40% of the one-thread in-process limit at batch 32",
                   "–", None)
    if b256 and limit:
        fraction = b256["requests_per_s"] / limit  # one row a request
        share = Target(share.goal, f"{fraction:.0%} ({b256['requests_per_s']:,.0f} req/s vs "
                       f"{limit:,.0f} rows/s)", fraction >= 0.4)
    return [
        _ratio_target("JSON c=64 req/s ≥ 6× MLServer's", shoal.get("json/c64"),
                      mlserver.get("json/c64"), "requests_per_s", at_least=6.0),
        _ratio_target("JSON c=64 p99 ≤ ⅕ of MLServer's", shoal.get("json/c64"),
                      mlserver.get("json/c64"), "p99_ms", at_most=0.2),
        _ratio_target("binary c=64 req/s ≥ 8× MLServer's JSON", shoal.get("binary/c64"),
                      mlserver.get("json/c64"), "requests_per_s", at_least=8.0),
        _ratio_target("JSON c=1 p50 ≤ 0.6× MLServer's", shoal.get("json/c1"),
                      mlserver.get("json/c1"), "p50_ms", at_most=0.6),
        _ratio_target("gRPC c=64 req/s ≥ 5× MLServer's gRPC", shoal.get("grpc/c64"),
                      mlserver.get("grpc/c64"), "requests_per_s", at_least=5.0),
        share,
    ]
