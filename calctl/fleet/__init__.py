"""Several boards of one host or lab: the boards file, the fan-out over them, the fleet report, report compare.

The public API of the fleet report: :func:`merge_reports` (report directories in, ``fleet-report.json`` and
``fleet-report.html`` out, infrastructure errors as rows) and its :class:`FleetReport`.
"""

from __future__ import annotations

from calctl.fleet.merge import FLEET_HTML, FLEET_JSON, SCHEMA, BoardRow, FleetReport, InfraError, merge_reports

__all__ = ["FLEET_HTML", "FLEET_JSON", "SCHEMA", "BoardRow", "FleetReport", "InfraError", "merge_reports"]
