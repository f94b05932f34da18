"""The demo: three senders each read a private document; one receiver answers questions whose answer
only one sender saw. Every protocol runs on the same episodes with the same model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .agent import Agent
from .protocols import Outcome, get_protocol

DOCUMENTS = (
    "Facilities log, week 12. The lobby lights were replaced on Tuesday. The secret access code for the north "
    "warehouse is 7341. The parking lot will be repainted in May. Visitors must sign in at the front desk. "
    "The elevator inspection passed without issues.",
    "Project notes. The quarterly review took place in the large meeting room. Maria Lopez leads the Falcon "
    "project, which is based in Lisbon. The Heron project moved its deadline to October. Coffee supplies were "
    "restocked. The team lunch is on Friday.",
    "Inventory report. Pallets were counted on Friday afternoon. The blue crate contains exactly 58 copper bolts. "
    "The forklift needs service next month. The loading doors lock at six in the evening. Two new shelves were "
    "installed near the exit.",
)


@dataclass(frozen=True)
class Episode:
    question: str
    gold: str
    source: int  # which sender holds the answer


EPISODES = (
    Episode("What is the secret access code for the north warehouse?", "7341", 0),
    Episode("Which city is the Falcon project based in?", "Lisbon", 1),
    Episode("How many copper bolts does the blue crate contain?", "58", 2),
)


def run_demo(agent: Agent, protocols: dict[str, dict], n_senders: int = 3,
             progress=None) -> Iterator[tuple[Episode, Outcome]]:
    """Yield (episode, outcome) for every protocol × episode whose source is among the senders."""
    docs = DOCUMENTS[:n_senders]
    episodes = [e for e in EPISODES if e.source < n_senders]
    built = {name: get_protocol(name, **params) for name, params in protocols.items()}  # every parameter, first
    for name, protocol in built.items():
        for ep in (progress(episodes, desc=name) if progress else episodes):
            yield ep, protocol.run([agent] * len(docs), docs, agent, ep.question)
