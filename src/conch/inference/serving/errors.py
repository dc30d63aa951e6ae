"""What the serving layer (and the routes over it) refuse about a request, on conch's one tree.

Everything below the serving layer raises errors of :mod:`conch.errors` that carry their own
status, code and request field (the engines', the model manager's, the providers', the model
sources'), so nothing here translates them: the web layer renders any of them. These are the
refusals the serving layer itself makes: a field it cannot honour, a model it cannot find.
"""

from __future__ import annotations

from conch import errors


class ServingError(errors.DomainError):
    """The family's root; ``where`` (OpenAI's ``param``) is the request field at fault."""


class InvalidRequest(ServingError, errors.Invalid):
    pass


class NotFound(ServingError, errors.NotFound):
    pass


class Conflict(ServingError, errors.Conflict):
    pass
