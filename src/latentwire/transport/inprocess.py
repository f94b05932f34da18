"""The default transport: every node in this process, steps run at once, messages passed by reference.

Zero copy: a message is the sender's own object (a `Local`), never encoded. `InProcessTransport(wire=True)`
makes nodes exchange wire bytes instead (signed with `sign=True`, sealed with `key=`), which exercises
the exact path of an out-of-process transport without starting any process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .base import Node, NodeConfig, Transport, TransportError


@dataclass(frozen=True, eq=False)
class Done:
    """A finished step's value, or the exception it raised (re-raised by `get`)."""
    value: Any = None
    error: BaseException | None = None
    node: str | None = None


class InProcessTransport(Transport):
    name = "inprocess"

    def __init__(self, *, wire: bool = False, sign: bool = False, key: bytes | None = None,
                 torch_threads: int | None = None):
        if (sign or key is not None) and not wire:
            wire = True  # a signature lives in the wire header; a key seals the wire bytes
        self.config = NodeConfig(wire=wire, sign=sign, key=key, torch_threads=torch_threads)
        self._nodes: dict[str, Node] = {}
        self._dead: set[str] = set()
        self._keys: dict[str, bytes] = {}

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._nodes)

    def node(self, name: str) -> Node:
        """The live Node object (in-process only: direct access for inspection)."""
        self._check_node(name)
        return self._nodes[name]

    def add(self, name: str, agent=None) -> None:
        self._check_new(name)
        self._dead.discard(name)
        node = Node(name, agent, self.config)
        self._nodes[name] = node
        if node.public_key is not None:
            self._keys[name] = node.public_key
            for n in self._nodes.values():
                n.trust(self._keys.values())

    def submit(self, node: str, step: Callable, *args, n_out: int = 1, **kw):
        self._check_node(node)
        try:
            args = tuple(self._resolve(a) for a in args)
            kw = {k: self._resolve(v) for k, v in kw.items()}
            value = step(self._nodes[node], *args, **kw)
        except Exception as e:  # kept in the handle, raised by get(): same behaviour as a remote step
            done = Done(error=e, node=node)
            return done if n_out == 1 else (done,) * n_out
        if n_out == 1:
            return Done(value, node=node)
        if not isinstance(value, tuple) or len(value) != n_out:
            raise TransportError(f"step {step.__name__} returned {type(value).__name__}, not {n_out} values")
        return tuple(Done(v, node=node) for v in value)

    def _resolve(self, value):
        if isinstance(value, Done):
            return self.get(value)
        if isinstance(value, (list, tuple, dict)) and any(isinstance(v, Done) for v in
                                                          (value.values() if isinstance(value, dict) else value)):
            raise TransportError("pass handles as top-level step arguments (as Ray resolves only those), not in a "
                                 f"{type(value).__name__}")
        return value

    def get(self, handle):
        if not isinstance(handle, Done):
            raise TransportError(f"not a handle of this transport: {type(handle).__name__}")
        if handle.error is not None:
            raise handle.error
        return handle.value

    def send(self, data: bytes):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TransportError(f"send takes bytes, got {type(data).__name__}")
        return Done(data)

    def kill(self, node: str) -> None:
        self._check_node(node)
        del self._nodes[node]
        self._keys.pop(node, None)
        self._dead.add(node)

    def close(self) -> None:
        self._nodes.clear()
