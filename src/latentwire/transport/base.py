"""The Transport interface: where agents live and how their messages travel.

A transport hosts named **nodes**. A node holds one agent (its model and tokenizer), the states it
keeps, a FragmentSet replica, and, when messages go over the wire, its own Ed25519 `Signer`. Work is
sent to a node as a **step**: a module-level function `step(node, *args)` run where the node lives
(in this process, or inside a Ray actor). A step's results come back as handles; a handle can be
passed as an argument to a step on another node, so a message goes from sender to receiver without
passing through the driver (Ray: through the object store).

    with InProcessTransport() as t:                     # or RayTransport(address=...)
        t.add("a", AgentSpec.pretrained("smollm2-135m"))
        h = t.submit("a", my_step, "hello")             # -> Handle
        value = t.get(h)                                # raises NodeLostError if "a" died

Messages between nodes are `Node.pack(body, ...)` / `Node.unpack(packed)`: by reference in-process
(zero copy), or wire bytes (docs/wire.md), signed by the sender and verified against the keys the
transport distributed, optionally sealed with a shared key.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import ConfigError, LatentWireError


class TransportError(LatentWireError):
    """A transport could not do what was asked (no such node, duplicate name, closed transport, ...)."""


class NodeLostError(TransportError):
    """A node (an agent's process or actor) died or was killed before its step finished.

    `.node` names it. Fragments already held by the surviving nodes' replicas are not affected."""

    def __init__(self, node: str, reason: str = "the node died or was killed"):
        self.node, self.reason = node, reason
        super().__init__(f"node {node!r} lost: {reason}")

    def __reduce__(self):
        return NodeLostError, (self.node, self.reason)


# -- what a node runs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AgentSpec:
    """How to build a node's agent where the node lives (each Ray actor loads its own model copy).

    `AgentSpec.pretrained("smollm2-135m")` loads a bundled model or local HF directory;
    `AgentSpec.tiny("llama", seed=0)` builds a tiny random-weight model (tests);
    `AgentSpec.factory(fn)` calls any zero-argument function returning an Agent (Ray pickles it).
    """
    kind: str  # "pretrained" | "tiny" | "factory"
    name: str | None = None
    seed: int = 0
    context_window: int | None = None
    fn: Callable | None = field(default=None, compare=False)
    device: str | None = None  # pretrained: None = the default where the node runs (placement.resolve)
    dtype: str | None = None

    @classmethod
    def pretrained(cls, name: str, context_window: int | None = None, device: str | None = None,
                   dtype: str | None = None) -> "AgentSpec":
        return cls("pretrained", name, context_window=context_window, device=device, dtype=dtype)

    @classmethod
    def tiny(cls, arch: str = "llama", seed: int = 0) -> "AgentSpec":
        return cls("tiny", arch, seed)

    @classmethod
    def factory(cls, fn: Callable) -> "AgentSpec":
        if not callable(fn):
            raise ConfigError(f"AgentSpec.factory takes a callable, got {type(fn).__name__}")
        return cls("factory", getattr(fn, "__name__", "factory"), fn=fn)

    def build(self):
        from ..agent import Agent

        if self.kind == "pretrained":
            return Agent.from_pretrained(self.name, device=self.device, dtype=self.dtype,
                                         context_window=self.context_window)
        if self.kind == "tiny":
            from ..models import tiny_model, tiny_tokenizer

            return Agent(tiny_model(self.name, seed=self.seed), tiny_tokenizer(), model_name=self.name,
                         context_window=self.context_window)
        if self.kind == "factory":
            agent = self.fn()
            if not isinstance(agent, Agent):
                raise ConfigError(f"AgentSpec.factory({self.name}) returned {type(agent).__name__}, not an Agent")
            return agent
        raise ConfigError(f"AgentSpec.kind: want pretrained, tiny or factory, got {self.kind!r}")


@dataclass(frozen=True)
class Local:
    """A message passed by reference (in-process transport, zero copy): the body and its wire fields."""
    body: Any
    protocol: str
    sender: str  # node name
    positions: tuple[int, ...] | None = None
    selection: Any = None


@dataclass(frozen=True)
class Received:
    """What a receiving node got, whatever the transport."""
    body: Any
    protocol: str
    positions: tuple[int, ...] | None
    selection: Any
    signed_by: str | None  # hex public key of a verified signature, None if unsigned / by reference
    wire_bytes: int  # bytes that crossed (0 when passed by reference)


@dataclass(frozen=True)
class NodeConfig:
    wire: bool = False  # encode messages as wire bytes (True on every out-of-process transport)
    sign: bool = False  # each node signs what it sends with its own Ed25519 key
    key: bytes | None = field(default=None, repr=False)  # shared 32-byte key: seal every message
    torch_threads: int | None = None  # torch.set_num_threads inside the node (None: leave as is)


class Node:
    """Everything that lives with one agent: the agent, kept states, a FragmentSet replica, a Signer."""

    def __init__(self, name: str, agent=None, config: NodeConfig = NodeConfig()):
        from ..agent import Agent
        from ..merge import FragmentSet
        from ..wire import Signer

        if config.torch_threads:
            import torch

            torch.set_num_threads(config.torch_threads)
        self.name, self.config = name, config
        self.agent = agent.build() if isinstance(agent, AgentSpec) else agent
        if self.agent is not None and not isinstance(self.agent, Agent):
            raise ConfigError(f"node {name!r}: want an Agent or AgentSpec, got {type(agent).__name__}")
        self.states: dict[str, Any] = {}  # what this agent keeps (e.g. query-blind finished states)
        self.replica = FragmentSet()
        self.signer = Signer.generate() if config.sign else None
        self.trusted: frozenset[bytes] | None = None
        self._protocols: dict = {}

    # -- identity --------------------------------------------------------------------------------
    @property
    def public_key(self) -> bytes | None:
        return None if self.signer is None else self.signer.public_key

    def trust(self, keys) -> None:
        """Accept signatures by these public keys too (each transport that uses this node gives it every
        node's key; trust is additive, so a served node used by several drivers accepts all of them)."""
        from ..wire import trusted_keys

        self.trusted = (self.trusted or frozenset()) | trusted_keys(keys)

    def protocol(self, name: str, params: dict):
        """The protocol object for (name, params), built once per node."""
        from ..protocols import get_protocol

        key = (name, repr(sorted((k, _param_key(v)) for k, v in params.items())))
        if key not in self._protocols:
            self._protocols[key] = get_protocol(name, **params)
        return self._protocols[key]

    # -- messages --------------------------------------------------------------------------------
    def pack(self, body, *, protocol: str, positions=None, selection=None, encoding: str | None = None):
        """A message for another node: by reference, or wire bytes (signed, and sealed under a shared key)."""
        if not self.config.wire:
            from ..message import Rows

            if positions is None and isinstance(body, Rows):
                positions = range(len(body))  # the wire's default, so both transports report the same
            return Local(body, protocol, self.name, None if positions is None else tuple(positions), selection)
        from .. import wire
        from ..merge import Fragment, FragmentSet
        from ..state import KVState

        # States and fragments carry their own geometry; rows take the sending agent's.
        own = isinstance(body, (KVState, Fragment, FragmentSet))
        geometry = None if own or self.agent is None else self.agent.geometry
        data = wire.encode(body, protocol=protocol, sender_geometry=geometry, positions=positions,
                           selection=selection, signer=self.signer, encoding=encoding)
        return wire.seal(data, self.config.key) if self.config.key else data

    def unpack(self, packed, expect: bool = True) -> Received:
        """Decode (strictly) and authenticate a message; TokenRows are rebuilt with this agent's embeddings.

        expect: check the sender's geometry against this node's agent (False for a replica that only stores)."""
        from .. import wire

        if isinstance(packed, Local):
            body, out = packed.body, Received(packed.body, packed.protocol, packed.positions, packed.selection,
                                              None, 0)
        else:
            if not isinstance(packed, (bytes, bytearray, memoryview)):
                raise TransportError(f"node {self.name!r} received a {type(packed).__name__}, not message bytes")
            data = wire.open_sealed(packed, self.config.key) if self.config.key else bytes(packed)
            expect = None if self.agent is None or not expect else self.agent.geometry
            verify = self.trusted if self.config.sign else None
            device = None if self.agent is None else self.agent.device  # decoded straight onto the model's device
            msg = wire.decode(data, expect=expect, verify=verify, device=device)
            out = Received(msg.body, msg.protocol, msg.positions, msg.selection,
                           None if msg.signed_by is None else msg.signed_by.hex(), len(packed))
            body = msg.body
        if isinstance(body, wire.TokenRows):
            if self.agent is None:
                raise TransportError(f"node {self.name!r} holds no model: token rows need its embedding table")
            vocab = self.agent.model.get_input_embeddings().num_embeddings
            top = int(body.token_ids.max()) if len(body) else -1
            if top >= vocab:  # checked here: an id past the table is an IndexError on CPU, a device assert on CUDA
                raise wire.WireFormatError("tensors.token_ids", f"id {top} is past node {self.name!r}'s vocabulary "
                                                                f"of {vocab}")
            out = Received(body.to_rows(self.agent.embed), out.protocol, out.positions, out.selection,
                           out.signed_by, out.wire_bytes)
        return out


def call(node: Node, fn: Callable, *args, **kw):
    """Run a step on a node (what every transport does where the node lives)."""
    return fn(node, *args, **kw)


# -- the interface ------------------------------------------------------------------------------------
class Transport(ABC):
    """Hosts named nodes and runs steps on them. Subclasses: InProcessTransport, RayTransport."""

    name: str = "?"
    config: NodeConfig

    @abstractmethod
    def add(self, name: str, agent=None) -> None:
        """Start a node holding an agent (an `AgentSpec`; in-process also a live `Agent`; None: a bare replica)."""

    @property
    @abstractmethod
    def nodes(self) -> tuple[str, ...]:
        """Names of the live nodes, in the order they were added."""

    @abstractmethod
    def submit(self, node: str, step: Callable, *args, n_out: int = 1, **kw):
        """Start `step(node, *args, **kw)` where the node lives. Returns a handle, or `n_out` handles when the
        step returns a tuple of that length. Handles may be passed as arguments of later steps.
        NodeLostError at once for a node known to be dead."""

    @abstractmethod
    def get(self, handle):
        """Wait for a handle's value. NodeLostError if its node died; the step's own typed error otherwise."""

    @abstractmethod
    def send(self, data: bytes):
        """Put bytes where any node can read them; returns a handle."""

    def recv(self, handle) -> bytes:
        """The bytes behind a `send` handle (or any handle whose value is bytes)."""
        value = self.get(handle)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TransportError(f"handle holds a {type(value).__name__}, not bytes")
        return bytes(value)

    @abstractmethod
    def kill(self, node: str) -> None:
        """Stop a node at once (its pending steps fail with NodeLostError)."""

    @abstractmethod
    def close(self) -> None:
        """Stop every node (and the engine when this transport started it)."""

    def run(self, node: str, step: Callable, *args, **kw):
        """submit + get."""
        return self.get(self.submit(node, step, *args, **kw))

    def get_all(self, handles: Sequence) -> list:
        return [self.get(h) for h in handles]

    def public_keys(self) -> dict[str, bytes]:
        """Each signing node's Ed25519 public key (empty when messages are not signed)."""
        return dict(self._keys)

    # helpers shared by implementations
    _keys: dict[str, bytes]

    def _check_new(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"node name: want a non-empty string, got {name!r}")
        if name in self.nodes:
            raise TransportError(f"a node named {name!r} already exists")

    def _check_node(self, name: str) -> None:
        if name in getattr(self, "_dead", ()):
            raise NodeLostError(name, "it was killed")
        if name not in self.nodes:
            raise TransportError(f"no node named {name!r}; nodes: {', '.join(self.nodes) or '(none)'}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def key_id(public_key: bytes | str | None) -> str | None:
    """A short printable id of a public key (first 16 hex characters of its SHA-256)."""
    if public_key is None:
        return None
    raw = bytes.fromhex(public_key) if isinstance(public_key, str) else public_key
    return hashlib.sha256(raw).hexdigest()[:16]


def _param_key(value):
    """A protocol parameter as a cache key: plain values as they are; objects (a LatentMap, a Translator) by a
    SHA-256 of their content (tensors by dtype, shape and bytes), since their repr does not show their weights
    and a node receives a fresh copy of them with every step (Ray unpickles each call's arguments)."""
    if isinstance(value, (str, int, float, bool, type(None), Path)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_param_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _param_key(v)) for k, v in value.items()))
    h = hashlib.sha256()
    _content(value, h, set())
    return f"<{type(value).__name__} {h.hexdigest()}>"


def _content(x, h, seen: set) -> None:
    """Feed `x`'s content to the hash `h`: tensors by dtype, shape and bytes, containers and objects recursively."""
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(x, (str, int, float, bool, type(None), Path, torch.dtype, torch.device)):
        h.update(repr(x).encode())
    elif id(x) in seen:
        h.update(b"<seen>")
    else:
        seen.add(id(x))
        if isinstance(x, dict):
            h.update(b"{")
            for k in sorted(x, key=repr):
                h.update(repr(k).encode())
                _content(x[k], h, seen)
        elif isinstance(x, (list, tuple, set, frozenset)):
            h.update(type(x).__name__.encode())
            for v in (sorted(x, key=repr) if isinstance(x, (set, frozenset)) else x):
                _content(v, h, seen)
        else:
            h.update(type(x).__qualname__.encode())
            _content(getattr(x, "__dict__", None) or repr(x), h, seen)
