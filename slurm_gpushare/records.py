"""Frozen record classes for the node hooks' path: what ``@dataclass(frozen=True)`` gives, without its start-up cost.

The node hooks start a fresh interpreter on every job (bench/node_hooks.py),
and the modules they load define about thirty frozen record classes.
Importing ``dataclasses`` (which pulls in inspect, ast, dis, tokenize) and
creating those classes (each compiles half a dozen generated methods with
``exec``) cost a hook about as much as the interpreter's own start. ``@record``
gives the same classes from plain closures: no imports, no code generation.

``@record`` and ``@record(order=True)`` follow dataclasses' semantics for
what those modules use: always frozen; fields in annotation order, inherited
fields first; defaults and ``field(default=..., default_factory=..., init=,
repr=, compare=, hash=)``; ``__post_init__``; ``__match_args__``;
``__eq__``/``__hash__``/ordering over the compared fields, only between
instances of the same class; ``repr`` as dataclasses writes it; assignment
raises ``FrozenInstanceError`` (an AttributeError). ``replace`` and
``fields`` are this module's own. A record is not a dataclass:
``dataclasses.asdict``, ``replace`` and ``fields`` refuse it (TypeError);
use this module's ``replace`` and ``fields``.
"""

from __future__ import annotations

# The type checker reads ``@record`` as a dataclass (PEP 681); typing is imported only by it, never at run time
# (the hooks' start-up budget: tests/unit/hooks/test_import_sets.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, dataclass_transform
else:

    def dataclass_transform(**_):
        return lambda decorated: decorated


_MISSING = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record (as dataclasses.FrozenInstanceError)."""


class Field:
    __slots__ = ("name", "default", "default_factory", "init", "repr", "compare", "hash")

    def __init__(self, default=_MISSING, default_factory=_MISSING, init=True, repr=True, compare=True, hash=None):
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default, self.default_factory = default, default_factory
        self.init, self.repr, self.compare, self.hash = init, repr, compare, hash

    def __repr__(self) -> str:
        return f"Field(name={self.name!r})"


def field(*, default=_MISSING, default_factory=_MISSING, init=True, repr=True, compare=True, hash=None) -> Any:
    """A field's options, as dataclasses.field (typed as the field's value, as dataclasses.field is)."""
    return Field(default, default_factory, init, repr, compare, hash)


def fields(record) -> tuple[Field, ...]:
    """The record's (or record class's) fields, in order."""
    try:
        return record.__record_fields__
    except AttributeError:
        raise TypeError(f"{record!r} is not a record class or instance") from None


def replace(record, /, **changes):
    """A copy of ``record`` with ``changes`` (init fields only), through ``__init__`` as dataclasses.replace does."""
    for f in fields(record):
        if not f.init:
            if f.name in changes:
                raise ValueError(f"field {f.name} is declared with init=False, it cannot be specified with replace()")
        elif f.name not in changes:
            changes[f.name] = getattr(record, f.name)
    return type(record)(**changes)


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(cls=None, /, *, order: bool = False):
    """``@record`` or ``@record(order=True)``: a frozen record class, see the module docstring."""

    def wrap(klass):
        return _make(klass, order)

    return wrap if cls is None else wrap(cls)


def _own_fields(cls) -> list[Field]:
    out = []
    for name in cls.__dict__.get("__annotations__", {}):
        value = cls.__dict__.get(name, _MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name = name
        if isinstance(value, Field):
            if f.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        out.append(f)
    return out


def _make(cls, order: bool):
    all_fields = _collect_fields(cls)
    init = tuple(f for f in all_fields if f.init)
    _check_default_order(init)
    methods = _methods(cls.__qualname__, all_fields, init, getattr(cls, "__post_init__", None))
    if order:
        methods.update(_ordering(tuple(f.name for f in all_fields if f.compare)))
    _install(cls, methods)
    cls.__match_args__ = tuple(f.name for f in init)  # type: ignore[misc]  # set on the class, as dataclasses does
    cls.__record_fields__ = all_fields
    return cls


def _collect_fields(cls) -> tuple[Field, ...]:
    """Inherited fields first (a redefined one keeps its place), then the class's own, in annotation order."""
    by_name: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in getattr(base, "__record_fields__", ()):
            by_name[f.name] = f
    for f in _own_fields(cls):
        by_name[f.name] = f
    return tuple(by_name.values())


def _has_default(f: Field) -> bool:
    return f.default is not _MISSING or f.default_factory is not _MISSING


def _check_default_order(init: tuple[Field, ...]) -> None:
    seen_default = False
    for f in init:
        if _has_default(f):
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")


def _initializer(qualname: str, all_fields: tuple[Field, ...], init: tuple[Field, ...], post_init):
    by_name = {f.name: f for f in all_fields}
    names = tuple(f.name for f in init)
    later = tuple(f for f in all_fields if not f.init and _has_default(f))

    def __init__(self, *args, **kwargs):
        if len(args) > len(names):
            raise TypeError(
                f"{qualname}.__init__() takes {len(names) + 1} positional arguments but {len(args) + 1} were given"
            )
        values = dict(zip(names, args, strict=False))
        for key, value in kwargs.items():
            if key not in by_name or not by_name[key].init:
                raise TypeError(f"{qualname}.__init__() got an unexpected keyword argument {key!r}")
            if key in values:
                raise TypeError(f"{qualname}.__init__() got multiple values for argument {key!r}")
            values[key] = value
        for f in init:
            if f.name not in values:
                if f.default is not _MISSING:
                    values[f.name] = f.default
                elif f.default_factory is not _MISSING:
                    values[f.name] = f.default_factory()
                else:
                    raise TypeError(f"{qualname}.__init__() missing required argument: {f.name!r}")
        for f in later:
            values[f.name] = f.default if f.default is not _MISSING else f.default_factory()
        self.__dict__.update(values)
        if post_init is not None:
            post_init(self)

    return __init__


def _methods(qualname: str, all_fields: tuple[Field, ...], init: tuple[Field, ...], post_init) -> dict:
    compared = tuple(f.name for f in all_fields if f.compare)
    hashed = tuple(f.name for f in all_fields if (f.compare if f.hash is None else f.hash))
    shown = tuple(f.name for f in all_fields if f.repr)

    def __repr__(self):
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return tuple(getattr(self, n) for n in compared) == tuple(getattr(other, n) for n in compared)

    def __hash__(self):
        return hash(tuple(getattr(self, n) for n in hashed))

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    return {
        "__init__": _initializer(qualname, all_fields, init, post_init),
        "__repr__": __repr__,
        "__eq__": __eq__,
        "__hash__": __hash__,
        "__setattr__": __setattr__,
        "__delattr__": __delattr__,
    }


def _ordering(compared: tuple[str, ...]) -> dict:
    """``order=True``: <, <=, >, >= over the compared fields, only between instances of the same class."""

    def key(self):
        return tuple(getattr(self, n) for n in compared)

    def compare(op):
        def method(self, other):
            return op(key(self), key(other)) if other.__class__ is self.__class__ else NotImplemented

        return method

    return {
        "__lt__": compare(tuple.__lt__),
        "__le__": compare(tuple.__le__),
        "__gt__": compare(tuple.__gt__),
        "__ge__": compare(tuple.__ge__),
    }


def _install(cls, methods: dict) -> None:
    qualname = cls.__qualname__
    for name, method in methods.items():
        if name in cls.__dict__ and name != "__hash__":  # Python sets __hash__ = None in a class that defines __eq__
            if name == "__repr__":
                continue  # the class's own repr wins, as with dataclasses
            raise TypeError(f"{qualname} defines {name}: not supported by slurm_gpushare.records")
        method.__qualname__ = f"{qualname}.{name}"
        setattr(cls, name, method)
