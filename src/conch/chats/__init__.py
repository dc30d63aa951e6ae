"""Chats: the studio's conversations with models, kept on the server per tenant (no HTTP).

- :mod:`conch.chats.tables`  the ``chats`` table (migration ``0008_chats``; its search index
  is written per database in the migration)
- :mod:`conch.chats.store`   :class:`ChatStore`: create, read, list, search, change, delete,
  and the bulk import of a browser's chats

docs/security.md ("Chats") describes the resource as a client sees it.
"""

from conch.chats.store import Chat, ChatStore

__all__ = ["Chat", "ChatStore"]
