"""External reference: AVP's own LatentMAS chain (pip package `avp`, 0.6.2) on a latent_vs_text cell.

    pip install avp==0.6.2 zstandard protobuf     # optional; never a latentwire dependency
    python benchmarks/avp_reference.py [--cell facts1_500] [--n 24] [--model qwen2.5-coder-0.5b] [--steps 8]

AVP runs the same weights latentwire loads (its `HuggingFaceConnector` wraps our Agent's model and
tokenizer): agent i calls `connector.think(prompt_i, steps=G, context=previous)`, which renders
prompt_i as a fresh chat (AVP's own template use) after the previous agents' cache and runs G latent
steps; the receiver then answers greedily after the last context. How the answer is generated: AVP's
`generate()` passes only the new prompt's ids with the cache, which transformers 5's `generate()`
rejects (it needs input ids covering the cached positions), so this script calls the model's
`generate()` itself with the ids every think() read, a pad id at each latent step's position (those
positions are cached and never re-read), then the question — AVP's own prompt rendering, cache and
attention mask otherwise. Writes docs/results/latent_vs_text/avp_<cell>_<model>.{md,json}: accuracy
with its bootstrap CI, median TTEOA (the agents run one after another: TTEOA = the whole chain).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from latentwire.agent import KV_PROMPT, Agent
from latentwire.bench.metrics import answer_scores, bootstrap_ci
from latentwire.bench.folder import environment
from latentwire.protocols.base import SENDER_PROMPT

sys.path.insert(0, str(Path(__file__).parent))
from latent_vs_text import OUT, cell_episodes  # noqa: E402  (the same episodes as the study's cells)


def render_ids(conn, text: str) -> torch.Tensor:
    """AVP's own rendering of a user message: (1, n) ids."""
    from avp.connectors.huggingface import _render_prompt, _to_messages, _tokenize_prompt

    ids, _ = _tokenize_prompt(conn.tokenizer, _render_prompt(conn.tokenizer, _to_messages(text)), conn._device)
    return ids


def avp_chain(conn, documents, question: str, steps: int, max_new_tokens: int) -> str:
    ctx, seen = None, []
    for doc in documents:
        prompt = SENDER_PROMPT.format(document=doc)
        ctx = conn.think(prompt, steps=steps, context=ctx)
        seen.append(render_ids(conn, prompt))  # what think() read
        seen.append(torch.full((1, steps), conn.tokenizer.pad_token_id or 0, dtype=torch.long,
                               device=seen[-1].device))  # latent positions: cached, never re-read
    q = render_ids(conn, KV_PROMPT.format(question=question))
    ids = torch.cat(seen + [q], dim=1)
    assert ids.shape[1] - q.shape[1] == ctx.past_key_values.get_seq_length(), "ids must cover the cache"
    with torch.no_grad():
        out = conn.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  past_key_values=ctx.past_key_values, max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=conn.tokenizer.pad_token_id)
    return conn.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--cell", default="facts1_500")
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    try:
        import avp
        from avp import HuggingFaceConnector
    except ImportError:
        sys.exit("AVP is not installed: pip install avp==0.6.2 zstandard protobuf (optional reference only)")
    agent = Agent.from_pretrained(args.model)
    conn = HuggingFaceConnector(model=agent.model, tokenizer=agent.tokenizer)
    episodes = cell_episodes(args.cell, args.n, args.seed)
    records = []
    for ep in episodes:
        t0 = time.perf_counter()
        answer = avp_chain(conn, ep.contexts, ep.question, args.steps, args.max_new_tokens)
        records.append({"episode": ep.id, "answer": answer, "tteoa": time.perf_counter() - t0,
                        **answer_scores(answer, ep.answers, ep.answer_match)})
        print(f"{ep.id}: {records[-1]['accuracy']:.0f} {records[-1]['tteoa']:.2f}s {answer[:60]!r}", flush=True)
    acc = bootstrap_ci([r["accuracy"] for r in records])
    med = statistics.median(r["tteoa"] for r in records)
    cmd = " ".join(["python benchmarks/avp_reference.py"] + sys.argv[1:])
    lines = [f"# AVP {avp.__version__} LatentMAS chain on `{args.cell}` ({args.model}, {len(records)} episodes, "
             f"G = {args.steps})", "", f"Command: `{cmd}`", "",
             f"Accuracy {acc[0]:.2f} [{acc[1]:.2f}, {acc[2]:.2f}] (95% bootstrap CI); median TTEOA {med:.2f} s "
             "(the chain's agents run one after another).", "",
             "How it ran: see the docstring of `benchmarks/avp_reference.py` (AVP's think() chain, greedy "
             "answer via the model's generate() with ids covering the cached positions)."]
    out = OUT / f"avp_{args.cell}_{args.model}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".md").write_text("\n".join(lines) + "\n")
    out.with_name(out.name + ".json").write_text(json.dumps({"command": cmd, "accuracy_ci": acc, "tteoa_median": med,
                                                             "records": records, "environment": environment()},
                                                            indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
