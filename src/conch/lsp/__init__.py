"""The conch language server (``conch lsp``): :mod:`.analysis` holds the editor features as
pure functions of a document's text, :mod:`.server` speaks the Language Server Protocol."""
