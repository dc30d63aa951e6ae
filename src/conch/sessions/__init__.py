"""Sessions: a sandbox of its own for every conversation (domain code, no HTTP).

A session keeps a program's bindings between runs and has a workspace of its own; it is
paused to disk when idle and resumed by whichever server runs it next. This package holds its
domain room; docs/sessions.md describes the data on disk, leases, quotas and path safety.

    tables.py    the ``sessions`` table (migration ``0006_sessions``)
    records.py   Session, the record handed around, and its public shape
    limits.py    what a create may ask for, checked against the server's limits
    store.py     SessionStore: every read and write of the table, leases included
    layout.py    SessionDirs: where a session lives under ``sessions_dir``
    files.py     SessionFiles: put, get, list, delete in a workspace, safe against its links
    state.py     SessionState: the saved bindings, changed all at once
    service.py   SessionService: the resource as routes, the CLI and MCP use it
    errors.py    the family's errors, on conch's one tree
"""
