"""Why attached K/V rows answer worse than re-prefilled rows, and what restores them. One CacheBack selection per
question (the same rows for every variant); what differs is how the receiver gets them:

  rows                  the receiver re-prefills them in its message slot (encoding='rows', the default)
  kv                    the read's K/V, attached as the receiver's prefix (encoding='kv')
  kv_in_slot            the read's K/V, attached inside the receiver's message slot (its own template around them)
  kv_in_slot_no_first   ... without each sender's first row (the row its attention sinks on)
  kv_in_slot_no_latent  ... without the latent rows (their K/V summarise the whole document)
  kv_reencoded          each sender re-reads its rows alone in the slot and ships those K/V (encoding='kv_reencoded')
  kv_sentences          each selected sentence (the sender's span unit), the first row and the latent rows re-read
                        alone in the slot: what a sender could encode before any question arrives
  kv_blend              the read's K/V in the slot, the receiver recomputing the 15% of rows its context changes
                        most (encoding='kv_blend', CacheBlend's selective recompute; blend.py)
  kv_blend_30, _50, _70 ... recomputing 30%, 50%, 70% (100% is `rows` exactly)
  kv_reencoded_blend    kv_reencoded, the receiver recomputing 15% (CacheBlend's own setting: rows encoded apart)

    python benchmarks/kv_delivery.py [--cell facts1_4000] [--groups 6] [--seed 7] [--ratio 4 --mass 0.5]

Dev episodes (seed 7; the stored-states study's are seed 2027), held reads (one read per set of documents, as
`stored_states.py`). Writes records.jsonl (one line per question, every variant's answer and score), summary.md
and command.txt under docs/results/kv_delivery/<cell>/; resumes by episode id.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stored_states as ss  # noqa: E402

from latentwire.agent import Agent  # noqa: E402
from latentwire.bench.episode import jsonl_lines  # noqa: E402
from latentwire.bench.metrics import answer_scores  # noqa: E402
from latentwire.bench.report import compare, with_holm  # noqa: E402
from latentwire.message import Rows  # noqa: E402
from latentwire.protocols import get_protocol  # noqa: E402
from latentwire.protocols.cacheback import RECOMPUTE  # noqa: E402
from latentwire.protocols.documents import token_document_spans  # noqa: E402
from latentwire.protocols.reads import HeldReads, shared_reads  # noqa: E402
from latentwire.state import KVState  # noqa: E402

VARIANTS = ("rows", "kv", "kv_in_slot", "kv_in_slot_no_first", "kv_in_slot_no_latent", "kv_reencoded",
            "kv_sentences", "kv_blend", "kv_blend_30", "kv_blend_50", "kv_blend_70",
            "kv_reencoded_blend")


def without(state: KVState, first: bool = False, latent: bool = False) -> KVState:
    """A compact part without its first row and/or its latent rows."""
    keep = torch.ones(len(state), dtype=torch.bool, device=state.device)
    keep[0] = not first
    if latent:
        keep &= state.token_ids != -1
    return state.select(torch.nonzero(keep).flatten()).compact()


def blocks(positions: list[int], units: list[list[int]]) -> list[list[int]]:
    """A sender's selected rows (their read `positions`, in order) grouped by the sentence unit each belongs to
    (`units`: read rows per unit, `CacheBack.span_groups`); a row in no unit (the first row, latent rows) is a
    block of its own kind: the blocks `kv_sentences` re-reads one at a time, in row order."""
    unit_of = {row: k for k, unit in enumerate(units) for row in unit}
    out, keys = [], []
    for i, pos in enumerate(positions):
        key = unit_of.get(pos, "outside")
        if keys and keys[-1] == key:
            out[-1].append(i)
        else:
            out.append([i]), keys.append(key)
    return out


def sentences(agent: Agent, part: KVState, positions: list[int], units: list[list[int]]) -> KVState:
    """`part` re-read block by block (`blocks`), each alone after the slot's template text, placed in row order."""
    return KVState.concat([agent.encode_rows(agent.rows(part.select(b))) for b in blocks(positions, units)])


def answers(agent: Agent, question: str, parts: list[KVState], max_new_tokens: int,
            positions: list[list[int]], units: list[list[list[int]]], only=VARIANTS) -> dict[str, str]:
    """The variants' (`only`) answers over the senders' selected rows (`parts`: each sender's read K/V, compact;
    `positions`: where each row sat in its sender's read; `units`: each sender's sentence units)."""
    slot = lambda ps, share=0.0: agent.answer_attached(question, KVState.concat(ps), max_new_tokens,  # noqa: E731
                                                       recompute=share).text
    make = {
        "rows": lambda: agent.answer(question, message=Rows.cat([agent.rows(p) for p in parts]),
                                     max_new_tokens=max_new_tokens).text,
        "kv": lambda: agent.answer(question, message=KVState.concat(parts), max_new_tokens=max_new_tokens).text,
        "kv_in_slot": lambda: slot(parts),
        "kv_in_slot_no_first": lambda: slot([without(p, first=True) for p in parts]),
        "kv_in_slot_no_latent": lambda: slot([without(p, latent=True) for p in parts]),
        "kv_reencoded": lambda: slot([agent.encode_rows(agent.rows(p)) for p in parts]),
        "kv_sentences": lambda: slot([sentences(agent, p, pos, u) for p, pos, u in zip(parts, positions, units)]),
        "kv_blend": lambda: slot(parts, RECOMPUTE),
        "kv_reencoded_blend": lambda: slot([agent.encode_rows(agent.rows(p)) for p in parts], RECOMPUTE),
    } | {f"kv_blend_{p}": (lambda share=p / 100: slot(parts, share)) for p in (30, 50, 70)}
    return {v: make[v]() for v in only}


def summary(records: list[dict], title: str) -> list[str]:
    """Accuracy per variant and each variant against `rows`, paired by question, clustered by set of documents
    (Holm over every variant's comparison)."""
    flat = [{"episode": r["episode"], "protocol": v, "accuracy": r["accuracy"][v]} for r in records for v in VARIANTS]
    clusters = {r["episode"]: r["set"] for r in records}
    rows = with_holm([c for v in VARIANTS[1:] if (c := compare(flat, v, "rows", clusters=clusters))])
    out = [title, "", f"{len(records)} questions over {len(set(clusters.values()))} sets of documents. Accuracy per "
           "variant; difference against `rows` [95% CI], exact sign-flip p and Holm p, each set of documents one "
           "paired observation.", "", "| variant | accuracy | vs rows | exact p | Holm p |", "|---|---:|---|---:|---:|",
           f"| rows | {rows[0]['acc_b']:.2f} | — | — | — |" if rows else ""]
    for c in rows:
        d, lo, hi = c["diff"]
        out.append(f"| {c['a']} | {c['acc_a']:.2f} | {100 * d:+.0f} pp [{100 * lo:+.0f}, {100 * hi:+.0f}] | "
                   f"{c['p']:.3g} | {c['p_holm']:.3g} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="facts1_4000", choices=[c for c in ss.CELLS if c.startswith("facts")])
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ratio", type=float, default=4.0)
    ap.add_argument("--mass", type=float, default=0.5)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", type=Path, default=ss.ROOT / "docs" / "results" / "kv_delivery")
    args = ap.parse_args()
    folder = args.out / args.cell
    folder.mkdir(parents=True, exist_ok=True)
    agent = Agent.from_pretrained(args.model, dtype=args.dtype)
    cb = get_protocol("cacheback", ratio=args.ratio, mass=args.mass, encoding="kv")
    selection = f"cacheback(ratio={args.ratio:g}, mass={args.mass:g})"  # the rows every variant delivers
    path = folder / "records.jsonl"
    records = [json.loads(x) for x in jsonl_lines(path.read_text(encoding="utf-8"))] if path.exists() else []
    dtype = str(agent.dtype).removeprefix("torch.")
    if any(r["dtype"] != dtype or r["selection"] != selection for r in records):
        sys.exit(f"{path} holds records of another dtype or selection; use another --out")
    have = {r["episode"]: r for r in records}
    missing = lambda ep_id: [v for v in VARIANTS if v not in have.get(ep_id, {}).get("answers", {})]  # noqa: E731
    for group in ss.groups_for(args.cell, args.groups, args.seed):
        if not any(missing(ep.id) for ep in group):
            continue
        held = HeldReads()
        for ep in group:
            with shared_reads(held):  # one read per sender for the whole group, as an agent holding it
                sent = [cb.send_one(agent, doc, ep.question, i) for i, doc in enumerate(ep.contexts)]
            if not (todo := missing(ep.id)):
                continue
            parts = [x.part for x in sent]
            units = [cb.span_groups(token_document_spans(agent, agent.chat_text(cb.sender_prompt(doc)), doc), doc)
                     for doc in ep.contexts]
            got = answers(agent, ep.question, parts, cb.max_new_tokens, [x.positions for x in sent], units, todo)
            rec = have.setdefault(ep.id, {"episode": ep.id, "set": group[0].id, "selection": selection,
                                          "dtype": dtype, "message_rows": sum(map(len, parts)), "answers": {},
                                          "accuracy": {}})  # an old record gains the variants added since
            rec["answers"] |= got
            rec["accuracy"] |= {v: answer_scores(a, ep.answers, ep.answer_match)["accuracy"] for v, a in got.items()}
            records = list(have.values())
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))  # whole, each time
            print(ep.id, rec["accuracy"], flush=True)
        held.release()
    cmd = " ".join(["python benchmarks/kv_delivery.py"] + sys.argv[1:])
    (folder / "command.txt").write_text(cmd + "\n")
    text = summary(records, f"# K/V delivery on one selection: `{selection}`, {args.cell}, seed {args.seed}, "
                   f"{args.model}, {dtype}")
    (folder / "summary.md").write_text("\n".join(text + ["", f"Command: `{cmd}`"]) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
