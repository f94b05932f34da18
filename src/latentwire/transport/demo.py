"""`latentwire demo --transport ray` and `latentwire serve`: agents as separate processes (Ray actors)
exchanging signed wire messages.

serve: starts the agents as named actors (namespace "latentwire") and keeps them up; any driver that
joins the same Ray cluster can use them (`latentwire demo --transport ray --attach`).
"""
from __future__ import annotations

import time

from ..demo import DOCUMENTS, EPISODES
from .base import AgentSpec, key_id
from .run import run_protocol

RECEIVER = "receiver"


def sender_names(n: int) -> list[str]:
    return [f"sender-{i}" for i in range(n)]


def _spec(model) -> AgentSpec:
    return model if isinstance(model, AgentSpec) else AgentSpec.pretrained(model)


def _transport(address: str | None, num_cpus: int):
    from .ray_transport import RayTransport

    return RayTransport(address=address, num_cpus=num_cpus)


def serve(model: str | AgentSpec, senders: int = 3, address: str | None = None, num_cpus: int = 2,
          once: bool = False, echo=print) -> int:
    """Start `senders` + 1 agents as named Ray actors and keep them up until interrupted (or return at once)."""
    import ray

    t = _transport(address, num_cpus)
    names = sender_names(senders) + [RECEIVER]
    echo(f"starting {len(names)} agents ({_spec(model).name}) as Ray actors ...")
    for name in names:
        t.add(name, _spec(model))
    keys = t.public_keys()
    for name in names:
        echo(f"  {name:10} pid {t.pid(name):>7}  signing key {key_id(keys.get(name))}")
    gcs = ray.get_runtime_context().gcs_address
    echo(f"\nserving on Ray cluster {gcs} (namespace latentwire). From another shell:\n"
         f"  RAY_ADDRESS={gcs} latentwire demo --transport ray --attach --senders {min(senders, 3)}\n"
         "Ctrl-C stops the agents.")
    try:
        while not once:
            time.sleep(3600)
    except KeyboardInterrupt:
        echo("stopping agents")
    finally:
        t.close()
    return 0


def demo(model: str | AgentSpec, senders: int = 3, latent_steps: int = 8, latent_mode: str = "rescale",
         ratio: float = 8.0, address: str | None = None, num_cpus: int = 2, attach: bool = False,
         echo=print) -> list:
    """Every demo episode under cacheback and fullkv, with each agent in its own Ray actor process."""
    from ..protocols import get_protocol

    t = _transport(address, num_cpus)
    names = sender_names(senders)
    try:
        for name in names + [RECEIVER]:
            if attach:
                t.attach(name)
            else:
                t.add(name, _spec(model))
        echo(f"{'attached to' if attach else 'started'} {senders + 1} agents as Ray actors (model {model}); "
             "every message is a signed wire message:")
        keys = t.public_keys()
        for name in names + [RECEIVER]:
            echo(f"  {name:10} pid {t.pid(name):>7}  signing key {key_id(keys.get(name))}")
        protocols = {"cacheback": dict(ratio=ratio, latent_steps=latent_steps, latent_mode=latent_mode),
                     "fullkv": dict(latent_steps=latent_steps, latent_mode=latent_mode)}
        docs = list(DOCUMENTS[:senders])
        rows = []
        for pname, params in protocols.items():
            protocol = get_protocol(pname, **params)
            for ep in (e for e in EPISODES if e.source < senders):
                out = run_protocol(t, protocol, names, docs, RECEIVER, ep.question)
                rows.append((pname, ep, ep.gold.lower() in out.answer.lower(), out))
        echo(f"\n{'protocol':9} {'ok':2} {'TTEOA s':>7} {'wall s':>6} {'wire bytes':>10}  signed by"
             f"{'':20} answer")
        for pname, ep, ok, out in rows:
            signers = ",".join(s[:6] for s in out.details["signed_by"])
            echo(f"{pname:9} {'✓' if ok else '✗':2} {out.tteoa:7.2f} {out.details['wall_s']:6.2f} "
                 f"{sum(out.details['wire_bytes']):10,d}  {signers:29} {out.answer.replace(chr(10), ' ')[:50]}")
        return rows
    finally:
        if attach:
            t.release()
        t.close()
