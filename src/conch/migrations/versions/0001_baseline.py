"""Baseline: the model registry, as the first release created it."""

from __future__ import annotations

from conch import db
from conch.migrations.snapshot import creating

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None

# ``conch.db.models`` is still the table of this revision (conch.migrations.snapshot says why
# that is enough, and what to do when it changes).
upgrade, downgrade = creating(revision, [db.models], "cbc4d1e06bc03592")
