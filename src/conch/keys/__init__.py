"""Keys, tenants and limits: who a request runs as, what it may do, and how much.

Domain code only (no HTTP): both servers' middleware and routes call it.

- :mod:`conch.keys.tables`   the tables (``api_keys``, ``key_usage``, ``key_events``,
  ``key_leases``, ``audit_log``), made by the ``0007_keys`` migration
- :mod:`conch.keys.hashing`  secrets (``ck-…``) and the SHA-256 that is all that is stored
- :mod:`conch.keys.scopes`   the scopes and :func:`~conch.keys.scopes.require_scope`
- :mod:`conch.keys.records`  :class:`Limits`, :class:`Principal`, :class:`KeyRecord`
- :mod:`conch.keys.service`  :class:`KeyService`: key CRUD, rotation, cached authentication
- :mod:`conch.keys.limits`   :class:`Limiter`: admission, settlement, leases, usage
- :mod:`conch.keys.audit`    :class:`AuditLog`: the append-only audit log

docs/security.md describes the model as a user sees it.
"""

from conch.keys.audit import AuditLog
from conch.keys.limits import Admission, KeyLimitExceeded, Limiter, LimitUsage, ModelNotAllowed
from conch.keys.records import ADMIN_PRINCIPAL, KeyRecord, Limits, Principal
from conch.keys.scopes import SCOPES, MissingScope, require_scope
from conch.keys.service import IssuedKey, KeyService

__all__ = [
    "ADMIN_PRINCIPAL",
    "SCOPES",
    "Admission",
    "AuditLog",
    "IssuedKey",
    "KeyLimitExceeded",
    "KeyRecord",
    "KeyService",
    "LimitUsage",
    "Limiter",
    "Limits",
    "MissingScope",
    "ModelNotAllowed",
    "Principal",
    "require_scope",
]
