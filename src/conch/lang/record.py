"""``record``: the part of ``dataclasses`` the language core uses, without its start-up cost.

Importing ``dataclasses`` (and the ``inspect`` it pulls in) takes about 20 ms, which every
``conch -c`` would pay. A record's annotated fields, its bases' first and any after a
``_: KW_ONLY`` marker last, become an ``__init__`` taking them in that order (a field given a
value in the class body is optional, that value its default), a ``__repr__`` naming them
and, unless ``eq=False``, ``__eq__`` and ``__hash__`` over them. A method the class defines
itself is kept, as a dataclass keeps it.
"""

from __future__ import annotations

# Only type checkers see typing: it costs start-up time too.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    _T = TypeVar("_T", bound=type)
else:

    def dataclass_transform(**_options):  # type: ignore[no-redef]
        return lambda f: f


def fields(cls: type, skip: tuple[str, ...] = ()) -> tuple[list[str], dict[str, Any]]:
    """The names of ``cls``'s fields in ``__init__`` order (less ``skip``), and their defaults."""
    names: list[str] = []
    keyword: list[str] = []
    for klass in reversed(cls.__mro__):
        after_marker = False
        # not inspect.get_annotations: importing inspect costs milliseconds at start-up
        for name in klass.__dict__.get("__annotations__", {}):  # noqa: RUF063
            if name == "_":
                after_marker = True
            elif name not in names and name not in keyword and name not in skip:
                (keyword if after_marker else names).append(name)
    names += keyword
    return names, {n: getattr(cls, n) for n in names if hasattr(cls, n)}


def repr_of(cls: type, names: list[str]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{n}={getattr(self, n, None)!r}" for n in names)
        return f"{cls.__name__}({inner})"

    return __repr__


def _init(cls: type, names: list[str], defaults: dict[str, Any]) -> Callable[..., None]:
    """An ``__init__`` written out for ``cls``'s fields, as ``dataclasses`` writes one: a record
    is made per builtin example at import, where a generic loop would cost ~7x as much."""
    params, body = [], []
    for name in names:
        params.append(f"{name}=_defaults[{name!r}]" if name in defaults else name)
        body.append(f"    self.{name} = {name}")
    source = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass")
    namespace: dict[str, Any] = {"_defaults": defaults}
    exec(compile(source, f"<record {cls.__name__}>", "exec"), namespace)
    init: Callable[..., None] = namespace["__init__"]
    init.__qualname__ = f"{cls.__name__}.__init__"
    return init


@dataclass_transform()
def record(cls: _T | None = None, /, *, eq: bool = True) -> Any:
    """Make ``cls`` a record (see the module's text); ``@record`` or ``@record(eq=False)``."""

    def build(klass: _T) -> _T:
        names, defaults = fields(klass)

        def key(self: Any) -> tuple[Any, ...]:
            return tuple([getattr(self, n) for n in names])

        def __eq__(self: Any, other: object) -> bool:
            if other.__class__ is not self.__class__:
                return NotImplemented
            return key(self) == key(other)

        def __hash__(self: Any) -> int:
            return hash(key(self))

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            # Written out on first use: compiling at import would cost the classes a program
            # never makes (most of them, in a short ``conch -c``).
            init = klass.__init__ = _init(klass, names, defaults)  # type: ignore[misc]
            init(self, *args, **kwargs)

        methods: dict[str, Any] = {"__init__": __init__, "__repr__": repr_of(klass, names)}
        if eq:
            methods.update(__eq__=__eq__, __hash__=__hash__)
        for name, method in methods.items():
            if name not in klass.__dict__:
                setattr(klass, name, method)
        return klass

    return build if cls is None else build(cls)
