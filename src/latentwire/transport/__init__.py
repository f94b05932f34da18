"""Where agents live and how their messages travel: the Transport interface, in-process (default, zero
copy) and Ray (each agent an actor; messages and fragments as signed wire bytes through the object
store), a protocol runner, and FragmentSet replication by anti-entropy.

    from latentwire.transport import AgentSpec, InProcessTransport, run_protocol
    from latentwire.transport.ray_transport import RayTransport      # pip install "latentwire[ray]"

    with RayTransport() as t:                                         # or RayTransport(address="ray://head:10001")
        for name in ("a", "b", "c", "r"):
            t.add(name, AgentSpec.pretrained("smollm2-135m"))
        out = run_protocol(t, get_protocol("cacheback", ratio=16), ["a", "b", "c"], docs, "r", question)
"""
from .base import AgentSpec, Local, Node, NodeConfig, NodeLostError, Received, Transport, TransportError, key_id
from .inprocess import InProcessTransport
from .replication import SyncReport, anti_entropy
from .run import protocol_spec, run_protocol

TRANSPORTS = ("inprocess", "ray")


def get_transport(name: str = "inprocess", **kw) -> Transport:
    """A transport by name: "inprocess" (default) or "ray" (imports Ray only then)."""
    if name == "inprocess":
        return InProcessTransport(**kw)
    if name == "ray":
        from .ray_transport import RayTransport

        return RayTransport(**kw)
    from ..errors import UnknownNameError

    raise UnknownNameError("transport", name, TRANSPORTS)


__all__ = ["TRANSPORTS", "AgentSpec", "InProcessTransport", "Local", "Node", "NodeConfig", "NodeLostError",
           "Received", "SyncReport", "Transport", "TransportError", "anti_entropy", "get_transport", "key_id",
           "protocol_spec", "run_protocol"]
