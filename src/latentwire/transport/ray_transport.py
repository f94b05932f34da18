"""Agents as Ray actors: each node is an actor process holding its own model, states and replica;
messages and fragments travel through Ray's object store as wire bytes (docs/wire.md), signed by the
sending actor's own Ed25519 key and verified by the receiving actor.

    t = RayTransport()                             # local: ray.init(num_cpus=2, include_dashboard=False)
    t = RayTransport(address="ray://head:10001")   # or RAY_ADDRESS=...: an existing cluster, unchanged code

Needs `pip install "latentwire[ray]"`. Every worker of a cluster must have latentwire installed.
A step's result stays in the object store: a handle passed to a step on another node is resolved
there, so message bytes go from actor to actor without passing through the driver.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, LatentWireError, MissingExtraError
from .base import Node, NodeConfig, NodeLostError, Transport, TransportError

NAMESPACE = "latentwire"


def _ray():
    try:
        import ray
    except ImportError as e:
        raise MissingExtraError("the Ray transport", "ray", "ray") from e
    return ray


class NodeActor:
    """The actor class (wrapped with ray.remote at first use): one Node, steps run in its process."""

    def __init__(self, name: str, agent, config: NodeConfig):
        self.node, self.error = None, None
        try:
            self.node = Node(name, agent, config)
        except Exception as e:  # kept: the driver gets the typed error from ready(), not a dead actor
            self.error = _portable(e)

    def public_key(self):
        if self.error is not None:
            raise self.error
        return self.node.public_key

    def trust(self, keys) -> None:
        self.node.trust(keys)

    def run(self, step: Callable, *args, **kw):
        try:
            return step(self.node, *args, **kw)
        except Exception as e:
            raise _portable(e) from None

    def pid(self) -> int:
        return os.getpid()


class RemoteError(TransportError):
    """A step failed in a node with an error that cannot cross processes as itself: `.kind` names its class."""

    def __init__(self, kind: str, message: str):
        self.kind, self.message = kind, message
        super().__init__(f"{kind}: {message}")

    def __reduce__(self):
        return RemoteError, (self.kind, self.message)


def _portable(e: Exception) -> Exception:
    """The exception itself when it survives pickling (WireFormatError, SignatureError, ...), else a RemoteError."""
    import pickle

    try:
        again = pickle.loads(pickle.dumps(e))
        if type(again) is type(e) and str(again) == str(e):
            return e
    except Exception:
        pass
    return RemoteError(type(e).__name__, str(e))


class RayTransport(Transport):
    """Nodes as Ray actors.

    address: None starts a local Ray (`num_cpus`, no dashboard) unless RAY_ADDRESS is set or Ray is
      already initialised; "auto", "ray://host:10001" or a GCS address joins an existing cluster.
    sign: every actor signs what it sends with its own Ed25519 key and accepts only signatures by keys
      a transport gave it (every node's key; default True).
    key: a shared 32-byte key: seal every message and fragment delta (ChaCha20-Poly1305).
    node_cpus / node_gpus: Ray resources each actor reserves (0 CPUs: any number of actors fit on a
      2-core machine). Scheduling only: the agents' models load where `Agent.from_pretrained` puts them.
    torch_threads: torch.set_num_threads inside each actor (default 1: actors share the cores).
    init_kwargs / runtime_env: passed to ray.init when this transport starts or joins Ray.

    Nodes are named actors in `namespace`: `attach(name)` uses one that `latentwire serve` (or another
    driver) started. `ready()` waits for every added actor to load its agent.
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = 2, sign: bool = True,
                 key: bytes | None = None, node_cpus: float = 0, node_gpus: float = 0,
                 torch_threads: int | None = 1, namespace: str = NAMESPACE, init_kwargs: dict | None = None,
                 runtime_env: dict | None = None):
        if (address or os.environ.get("RAY_ADDRESS")) and "RAY_AUTH_MODE" not in os.environ \
                and (Path.home() / ".ray" / "auth_token").exists():
            # Ray 2.6x starts local clusters with token auth (~/.ray/auth_token), but a driver joining by
            # address sends the token only when RAY_AUTH_MODE=token is set before Ray is imported.
            os.environ["RAY_AUTH_MODE"] = "token"
        ray = _ray()
        self.config = NodeConfig(wire=True, sign=sign, key=key, torch_threads=torch_threads)
        self._owns_ray = False
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS")
            kw = dict(namespace=namespace, log_to_driver=False, ignore_reinit_error=True) | (init_kwargs or {})
            if runtime_env:
                kw["runtime_env"] = runtime_env
            if address:
                ray.init(address=address, **kw)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, **kw)
            self._owns_ray = True
        self._namespace = namespace
        self._options = dict(num_cpus=node_cpus, num_gpus=node_gpus, max_restarts=0, max_task_retries=0)
        self._actors: dict = {}
        self._pending: dict = {}  # name -> ObjectRef of its public key, until ready()
        self._dead: set[str] = set()
        self._keys: dict[str, bytes] = {}
        self._cls = ray.remote(NodeActor)

    # -- nodes -----------------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._actors)

    def add(self, name: str, agent=None, *, detached: bool = False) -> None:
        from .base import AgentSpec

        self._check_new(name)
        self._dead.discard(name)
        if agent is not None and not isinstance(agent, AgentSpec):
            raise ConfigError(f"node {name!r}: a Ray node takes an AgentSpec (each actor loads its own model), "
                              f"not a {type(agent).__name__}")
        opts = dict(self._options, name=name, namespace=self._namespace)
        if detached:
            opts["lifetime"] = "detached"
        try:
            actor = self._cls.options(**opts).remote(name, agent, self.config)
        except ValueError as e:  # Ray: a named actor with this name already exists in the namespace
            raise TransportError(f"node {name!r}: {e}; use attach({name!r}) to use a served node") from e
        self._actors[name] = actor
        self._pending[name] = actor.public_key.remote()  # actors start in parallel; see _ready()

    def attach(self, name: str) -> None:
        """Use a node another driver started (e.g. `latentwire serve`) under this name."""
        ray = _ray()
        self._check_new(name)
        try:
            self._actors[name] = ray.get_actor(name, namespace=self._namespace)
        except ValueError as e:
            raise TransportError(f"no served node named {name!r} in namespace {self._namespace!r}") from e
        self._pending[name] = self._actors[name].public_key.remote()

    def ready(self) -> None:
        """Wait for every new actor to start (its model loaded), then give every node every public key."""
        if not self._pending:
            return
        for name, ref in list(self._pending.items()):
            try:
                key = self.get_node(name, ref)
            except Exception:  # its agent failed to load: the node is removed, its error raised
                del self._pending[name]
                _ray().kill(self._actors.pop(name), no_restart=True)
                raise
            del self._pending[name]
            if key is not None:
                self._keys[name] = key
        if self._keys:
            keys = list(self._keys.values())
            for name, actor in self._actors.items():
                self.get_node(name, actor.trust.remote(keys))

    def public_keys(self) -> dict[str, bytes]:
        self.ready()
        return dict(self._keys)

    def pid(self, name: str) -> int:
        """The process id of a node's actor (they are separate processes)."""
        self._check_node(name)
        self.ready()
        return self.get_node(name, self._actors[name].pid.remote())

    # -- steps -----------------------------------------------------------------------------------
    def submit(self, node: str, step: Callable, *args, n_out: int = 1, **kw):
        self._check_node(node)
        self.ready()
        actor = self._actors[node]
        method = actor.run if n_out == 1 else actor.run.options(num_returns=n_out)
        refs = method.remote(step, *map(_unwrap, args), **{k: _unwrap(v) for k, v in kw.items()})
        if n_out == 1:
            return _Handle(refs, node)
        return tuple(_Handle(r, node) for r in refs)

    def get(self, handle):
        if not isinstance(handle, _Handle):
            raise TransportError(f"not a handle of this transport: {type(handle).__name__}")
        return self.get_node(handle.node, handle.ref)

    def get_node(self, node: str | None, ref):
        ray = _ray()
        from ray import exceptions as rex

        try:
            return ray.get(ref)
        except rex.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, (rex.RayActorError, rex.ObjectLostError)):
                raise NodeLostError(node or "?", f"a step it depended on lost its node ({type(cause).__name__})") \
                    from e
            if isinstance(cause, LatentWireError):
                raise cause from None
            raise
        except (rex.RayActorError, rex.ObjectLostError, rex.OwnerDiedError) as e:
            raise NodeLostError(node or "?", f"{type(e).__name__}") from None

    def send(self, data: bytes):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TransportError(f"send takes bytes, got {type(data).__name__}")
        return _Handle(_ray().put(bytes(data)), None)

    def kill(self, node: str) -> None:
        self._check_node(node)
        _ray().kill(self._actors.pop(node), no_restart=True)
        self._dead.add(node)
        self._keys.pop(node, None)
        self._pending.pop(node, None)

    def close(self) -> None:
        ray = _ray()
        for name in list(self._actors):
            try:
                ray.kill(self._actors.pop(name), no_restart=True)
            except Exception:  # already gone
                pass
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False

    def release(self) -> None:
        """Forget the nodes without killing them (served nodes stay up for other drivers)."""
        self._actors.clear()


class _Handle:
    """A Ray ObjectRef and the node that computes it. Passed to `submit`, Ray resolves it in the callee."""

    __slots__ = ("ref", "node")

    def __init__(self, ref, node):
        self.ref, self.node = ref, node


def _unwrap(arg):
    """A handle given as a step argument becomes its ObjectRef, which Ray resolves in the callee's process."""
    if isinstance(arg, _Handle):
        return arg.ref
    if isinstance(arg, (list, tuple, dict)) and any(isinstance(v, _Handle) for v in
                                                    (arg.values() if isinstance(arg, dict) else arg)):
        raise TransportError("pass handles as top-level step arguments (Ray resolves only those), not in a "
                             f"{type(arg).__name__}")
    return arg
