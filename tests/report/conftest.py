"""The handbook summary and the report written from it, built once for the report's tests."""

from __future__ import annotations

import pytest

from ray_layout.report.summary import TuneSummary
from ray_layout.report.write import write_report
from tests.helpers.report_summary import handbook_summary


@pytest.fixture(scope="session")
def summary() -> TuneSummary:
    return handbook_summary()


@pytest.fixture(scope="session")
def written(summary, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return out, write_report(summary, out)
