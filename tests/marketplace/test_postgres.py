"""The marketplace on PostgreSQL: full-text search (tsvector, ts_rank), install, digests."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch import db
from conch.marketplace.errors import MarketplaceError
from conch.marketplace.records import PublishRequest
from conch.marketplace.service import MarketplaceService
from tests.marketplace.conftest import agent
from tests.orchestration.pg import postgres_cluster

pytestmark = pytest.mark.timeout(300)


def test_search_and_install_on_postgresql(tmp_path: Path) -> None:
    with postgres_cluster(tmp_path) as url:
        try:
            service = MarketplaceService(db.engine_for(url))
            for name, description in [
                ("report", "Writes one report."),
                ("report-builder", "Builds a report from data."),
                ("csv-reader", "Reads CSV files and reports their columns."),
                ("unrelated", "Does something else entirely."),
            ]:
                service.publish(PublishRequest(**agent(name, description=description)))
            service.publish(PublishRequest(**agent("report", version="2.0.0-beta.1")))
            out = service.search("report")
            names = [r["name"] for r in out["results"]]
            assert names[0] == "report" and out["total"] == 3
            assert set(names) == {"report", "report-builder", "csv-reader"}
            assert out["results"][0]["version"] == "1.0.0"  # the stable one is the latest
            assert [r["name"] for r in service.search("csv")["results"]] == ["csv-reader"]
            assert service.search("repo")["total"] == 3  # the last word is a prefix
            assert service.search("", limit=2, offset=2)["results"][0]["name"] == "report-builder"
            assert service.install("report", "^1")["version"] == "1.0.0"
            with db.engine_for(url).begin() as conn:
                conn.exec_driver_sql(
                    "UPDATE marketplace_agents SET model = 'evil:x' WHERE name = 'unrelated'"
                )
            with pytest.raises(MarketplaceError) as err:
                service.install("unrelated")
            assert err.value.kind == "IntegrityError"
        finally:
            db.dispose_all()
