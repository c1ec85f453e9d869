"""slurm_gpushare.records' @record behaves as @dataclass(frozen=True) for what the node hooks' modules use.

Each check runs against the stdlib's dataclasses too, so the two are held to the same behaviour.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys

import pytest

from slurm_gpushare import records
from tests.conftest import ROOT


class Stdlib:
    """The stdlib under the records module's names: @record is @dataclass(frozen=True)."""

    field = staticmethod(dataclasses.field)
    fields = staticmethod(dataclasses.fields)
    replace = staticmethod(dataclasses.replace)

    @staticmethod
    def record(cls=None, /, *, order=False):
        return dataclasses.dataclass(cls, frozen=True, order=order)


IMPLS = pytest.mark.parametrize("impl", [Stdlib, records], ids=["dataclasses", "records"])


def make(impl):
    @impl.record
    class Base:
        a: int

    @impl.record
    class Rec(Base):
        """A record."""

        b: str = "x"
        env: dict = impl.field(default_factory=dict)
        cache: int = impl.field(default=0, init=False, repr=False, compare=False, hash=False)

        def __post_init__(self):
            object.__setattr__(self, "cache", self.a * 2)

        def __str__(self):
            return f"rec {self.a}"

    @impl.record(order=True)
    class Ordered:
        path: str
        message: str

    return Base, Rec, Ordered


@IMPLS
def test_init_defaults_repr_and_post_init(impl):
    _base, rec, _ordered = make(impl)
    r = rec(1, b="y")
    assert (r.a, r.b, r.env, r.cache) == (1, "y", {}, 2)
    assert repr(r) == "make.<locals>.Rec(a=1, b='y', env={})"
    assert str(r) == "rec 1" and rec.__doc__ == "A record."
    assert vars(r) == {"a": 1, "b": "y", "env": {}, "cache": 2}
    assert rec(1).env is not rec(1).env  # a fresh default per instance
    assert rec.__match_args__ == ("a", "b", "env")
    match r:
        case rec(1, b):
            assert b == "y"
        case _:
            pytest.fail("no match")


@IMPLS
@pytest.mark.parametrize(
    "args, kwargs", [((), {}), ((1, "b", {}, 4), {}), ((1,), {"a": 2}), ((1,), {"cache": 3}), ((1,), {"nope": 3})]
)
def test_bad_arguments_are_type_errors(impl, args, kwargs):
    _base, rec, _ordered = make(impl)
    with pytest.raises(TypeError):
        rec(*args, **kwargs)


@IMPLS
def test_frozen(impl):
    _base, rec, _ordered = make(impl)
    r = rec(1)
    with pytest.raises(AttributeError, match="cannot assign to field 'a'"):
        r.a = 2
    with pytest.raises(AttributeError):
        del r.b
    assert r.a == 1


@IMPLS
def test_equality_hash_and_order(impl):
    base, rec, ordered = make(impl)
    assert rec(1, "y") == rec(1, "y") and rec(1, "y") != rec(1, "z")
    assert rec(1) != base(1)  # another class, even a base, is never equal
    assert hash(rec(1, "y", None)) == hash(rec(1, "y", None))
    assert len({ordered("a", "1"), ordered("a", "1"), ordered("b", "1")}) == 2
    assert sorted([ordered("b", "1"), ordered("a", "2"), ordered("a", "1")]) == [
        ordered("a", "1"),
        ordered("a", "2"),
        ordered("b", "1"),
    ]
    with pytest.raises(TypeError):
        ordered("a", "1") < ("a", "2")  # noqa: B015


@IMPLS
def test_replace_fields_and_copy(impl):
    _base, rec, _ordered = make(impl)
    r = rec(1, "y", {"k": "v"})
    changed = impl.replace(r, b="z")
    assert (changed.a, changed.b, changed.env, changed.cache) == (1, "z", {"k": "v"}, 2) and r.b == "y"
    with pytest.raises(ValueError):
        impl.replace(r, cache=5)
    assert [f.name for f in impl.fields(rec)] == ["a", "b", "env", "cache"]
    assert copy.deepcopy(r) == r


@records.record(order=True)
class Pickled:
    a: int
    b: tuple[str, ...] = ()


def test_pickle():
    p = Pickled(1, ("x",))
    assert pickle.loads(pickle.dumps(p)) == p


def test_no_own_equality():
    with pytest.raises(TypeError, match="__eq__"):

        @records.record
        class OwnEq:
            a: int

            def __eq__(self, other):
                return True


def test_a_field_without_default_after_one_with_is_refused():
    with pytest.raises(TypeError, match="non-default argument 'b'"):

        @records.record
        class Bad:
            a: int = 0
            b: int


def test_a_record_is_not_a_dataclass_and_says_so():
    """The stdlib's helpers refuse a record (it does not pretend to be one); this module's own take it."""
    _base, rec, _ordered = make(records)
    r = rec(1)
    assert not dataclasses.is_dataclass(r) and not hasattr(records, "dataclass")
    with pytest.raises(TypeError):
        dataclasses.asdict(r)
    assert [f.name for f in records.fields(r)] == ["a", "b", "env", "cache"] and records.replace(r, a=2).a == 2


def test_the_hooks_modules_load_neither_dataclasses_nor_typing():
    """What the prolog and epilog import on their way (the fake NVML included): not the modules this replaces."""
    code = (
        "import sys\n"
        "import slurm_gpushare.hooks.prolog, slurm_gpushare.hooks.epilog, slurm_gpushare.hooks._common\n"
        "import slurm_gpushare.node.prolog, slurm_gpushare.node.epilog, slurm_gpushare.node.nodeconfig\n"
        "import slurm_gpushare.gpu.fakenvml, slurm_gpushare.proc, slurm_gpushare.node.mps\n"
        "print(' '.join(m for m in ('dataclasses', 'typing', 'inspect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
