"""Sessions: the ``sessions`` table (conch.sessions.tables).

A domain branch of its own from the baseline, as the orchestration and marketplace branches
are: the sessions' schema moves with the sessions' code, and downgrading one domain never
touches another's tables.
"""

from __future__ import annotations

from conch.migrations.snapshot import creating
from conch.sessions import tables as t

revision = "0006_sessions"
down_revision = "0001_baseline"
branch_labels = ("sessions",)
depends_on = None

# The sessions table is still that of this revision (conch.migrations.snapshot says why that
# is enough, and what to do when it changes).
upgrade, downgrade = creating(revision, [t.sessions], "4f5f1365e63fd0e3")
