"""The core's failure kinds (csrc/errors.h, exported as _C.ErrorKind) and the Python exception
classes (r2cc_serve/errors.py, mapped in r2cc_serve/comm/errors.py) stay one set: a kind added
on one side only fails here."""

import ast
import inspect
import pathlib

import pytest
import torch

from r2cc_serve import _C, errors
from r2cc_serve.comm.errors import BY_KIND

CORE_KINDS = [name for name in _C.ErrorKind.__members__ if name != "none"]


def test_every_core_kind_has_its_own_exception_class():
    assert sorted(BY_KIND) == sorted(CORE_KINDS)
    for kind, cls in BY_KIND.items():
        assert cls.kind == kind and issubclass(cls, errors.GroupAbortedError), (kind, cls)


def test_every_exception_class_with_a_kind_is_mapped_to_it():
    classes = [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, errors.R2CCError)]
    with_kind = [cls for cls in classes if cls.kind]
    assert with_kind, classes
    for cls in with_kind:
        assert cls.kind in CORE_KINDS, cls
        assert BY_KIND[cls.kind] is cls, cls


def test_kinds_have_stable_values_and_the_stub_lists_them():
    assert _C.ErrorKind.none.value == 0  # the wire's "no error"; the rest travel in abort frames
    assert len({k.value for k in _C.ErrorKind.__members__.values()}) == len(_C.ErrorKind.__members__)
    stub = ast.parse(pathlib.Path(_C.__file__).with_name("_C.pyi").read_text())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "ErrorKind")
    assert [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)] == list(_C.ErrorKind.__members__)


@pytest.mark.parametrize("how, expected", [("abort", errors.GroupAbortedError),
                                           ("close", errors.CommunicatorClosedError)])
def test_a_kind_from_the_core_reaches_its_class(how, expected):
    from torch.distributed import HashStore

    from r2cc_serve import Communicator

    comm = Communicator(0, 1, HashStore(), rails=["127.0.0.1"], group=how)  # a group of one: no peers
    try:
        getattr(comm, how)(*(["test"] if how == "abort" else []))
        with pytest.raises(errors.R2CCError) as info:
            comm.all_reduce(torch.ones(4))
        assert type(info.value) is expected and info.value.kind in CORE_KINDS
        assert comm.error_kind() == expected.kind
    finally:
        comm.close()
