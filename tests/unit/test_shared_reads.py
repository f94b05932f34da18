"""One read per sender: inside `shared_reads()` every protocol starting from a sender's state reuses it,
and is charged the read's measured time; outside it nothing is kept."""
import json

import torch

from latentwire.agent import Agent
from latentwire.bench.episode import Episode, Span, write_episodes
from latentwire.bench.runner import RunConfig, run
from latentwire.models import tiny_model, tiny_tokenizer
from latentwire.protocols import get_protocol
from latentwire.protocols.reads import read, shared_reads

DOC, Q = "The blue crate holds 58 bolts. The red crate holds 12 nails.", "How many bolts?"


def _prefills(agent: Agent) -> int:
    return sum(c.op == "prefill" for c in agent.calls)


def test_outside_a_block_every_read_is_computed(agent_for):
    agent = agent_for("llama")
    a, b = read(agent, DOC, 2, "rescale"), read(agent, DOC, 2, "rescale")
    assert a.state is not b.state and not a.shared and not b.shared and _prefills(agent) == 2
    assert torch.equal(a.state.layers[0].keys, b.state.layers[0].keys)


def test_inside_a_block_a_read_is_computed_once_and_charged_its_measured_time(agent_for):
    agent = agent_for("qwen2")
    with shared_reads() as memo:
        first = read(agent, DOC, 2, "rescale")
        again = read(agent, DOC, 2, "rescale")
        other_g = read(agent, DOC, 0, "rescale")  # another G: its own state, the same prefill
        other_doc = read(agent, DOC + " More.", 2, "rescale")
        assert again.state is first.state and again.shared and not first.shared
        assert again.seconds == first.seconds > 0
        assert len(other_g.state) == len(first.state) - 2 and not other_g.shared
        assert _prefills(agent) == 2  # DOC once (shared by G = 2 and G = 0), the other document once
        assert other_doc.state is not first.state and len(memo) == 5  # 2 prefills + 3 states
    assert len(memo) == 0  # a block keeps nothing once it closes
    assert not read(agent, DOC, 2, "rescale").shared


def test_protocols_share_a_read_and_report_it(agent_for):
    agent = agent_for("llama")
    protocols = [get_protocol("fullkv", latent_steps=1, query_aware=False, max_new_tokens=1),
                 get_protocol("cacheback", ratio=4, latent_steps=1, max_new_tokens=1),
                 get_protocol("cacheback", ratio=8, latent_steps=1, max_new_tokens=1),
                 get_protocol("merge", latent_steps=1, query_aware=False, max_new_tokens=1)]
    with shared_reads():
        outs = [p.run([agent], [DOC], agent, Q) for p in protocols]
    assert _prefills(agent) == 1  # one sender read for four protocols (receivers record "answer")
    assert outs[0].details["shared_reads"] == 0 and outs[3].details["shared_reads"] == 1
    assert [o.details["senders"][0]["shared_read"] for o in outs[1:3]] == [True, True]
    # every protocol is charged at least the one measured read
    read_s = outs[1].details["senders"][0]["read_s"]
    assert all(min(o.sender_seconds) >= read_s for o in outs)
    # alone, each protocol gives the same answer as when sharing (states are values)
    alone = [p.run([agent], [DOC], agent, Q) for p in protocols]
    assert [o.answer for o in alone] == [o.answer for o in outs]


def test_the_runner_reads_each_sender_once_per_episode(tmp_path):
    eps = [Episode(f"e{i}", "t", "fanin", "What is the code?", ["7341"],
                   ("The code is 7341. " * (1 + i), "Nothing here."), (Span(0, 0, 17),)) for i in range(2)]
    write_episodes(tmp_path / "task.jsonl", eps)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    spec = ",".join(f"cacheback(ratio={r}, latent_steps=1, max_new_tokens=1)" for r in (2, 4, 8, 16))
    run(RunConfig(str(tmp_path / "task.jsonl"), spec + ",fullkv(latent_steps=1, query_aware=False, max_new_tokens=1)",
                  "llama"), tmp_path / "run", progress=False, agent=agent)
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 10 and all(r["error"] is None for r in records)
    assert _prefills(agent) == 2 * 2  # 2 episodes × 2 senders; without sharing 2 × 5 × 2
    assert [r["episode"] for r in records] == ["e0"] * 5 + ["e1"] * 5  # episode by episode
