"""kvpress parity on a real model: what kvpress keeps run its own way, what latentwire's recorded scores keep.

    python benchmarks/press_parity.py [--model smollm2-135m] [--task facts] [--n 8] [--seed 0]
                                      [--presses snapkv,h2o,tova,knorm,kvzip] [--filter length_bucket=1000]

Documents: of each of N episodes, the first sender that holds gold evidence, prefilled in the sender's prompt
(SENDER_PROMPT, the sender's chat template): T token rows. For every press and kvpress compression ratio
(0.5, 0.75, 0.875 = 2×, 4×, 8×), three kept sets:

  kvpress  the press run its own way on the prompt's ids. snapkv/h2o/tova/knorm: `with press(model)`
           prefill into a fresh cache, which comes out pruned to the top k = max(1, int(T·(1-ratio))) rows
           of each (layer, KV head); the kept rows are read off the pruned keys (each is byte-equal to exactly
           one row of an unpruned prefill under the same attention implementation). kvzip: KVzipPress ranks
           all (layer, KV head, row) pairs together (its n_sink first rows forced in) and marks the losers in
           each attention module's `masked_key_indices`; kept = the other rows of each (layer, KV head).
  ours     the same press recorded latentwire's way (`record_prefill_layer_scores`, `kvzip_layer_scores`: the
           scores the selectors aggregate), top-k per (layer, KV head) with the k kvpress kept in that cell
           (kvzip: its n_sink first rows forced in first, as kvpress does).
  rows     latentwire's row selection: the recorded scores aggregated to one per row (mean over KV heads,
           then over layers, as every press selector does) and the top-k rows, k as above (no spans).

Columns: `identical` = share of (layer, KV head) cells whose kvpress and ours sets are equal; `a top-k` = share
of cells where kvpress's set is one of the top-k sets of the recorded scores (no kept row scores below a dropped
one: equal up to ties); `Jaccard` = mean Jaccard of the kvpress and ours sets; evidence kept = share of the gold
(layer, KV head, row) triples kvpress keeps / ours keeps, and share of the gold rows `rows` keeps; `chance` = k/T,
what a random choice keeps. All are means over documents. `kvpress` near `chance` means the press itself does
not see this evidence; `kvpress` well above `rows` is what aggregating to one set of rows costs. Gold rows:
prompt rows whose document characters overlap a gold evidence span.

Only global layers are compared (on Gemma3 kvpress also hooks the sliding layers, and may fail there). kvzip
runs under sdpa on both sides (KVzipPress's masking asserts non-eager attention): an eager model is switched
for it and restored. Equal scores (ties: bf16; knorm, whose layer-0 key norm is a function of the token alone,
as RoPE keeps norms) can make sets differ with no score difference: `a top-k` tells those apart. A press that
fails is reported with its reason and the side that failed, not dropped. Writes
docs/results/press_parity_<model>.{md,json} (a task or filters other than the default add a tag).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch
from kvpress.utils import compute_n_kept

from latentwire.agent import Agent
from latentwire.bench.folder import environment
from latentwire.bench.runner import load_task_episodes, parse_filters, select_episodes
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.protocols.cacheback import document_rows
from latentwire.select import get_selector
from latentwire.select.press_recording import (_aggregate, _global_layers, _kv, _model_restored, _quiet_kvpress,
                                               kvzip_layer_scores, record_prefill_layer_scores)
from latentwire.models.compat import cache_arg

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
PRESSES = ("snapkv", "h2o", "tova", "knorm", "kvzip")
RATIOS = (0.5, 0.75, 0.875)  # kvpress compression_ratio: 2×, 4×, 8×
METRICS = ("identical", "a_top_k", "jaccard", "ev_kvpress", "ev_ours", "ev_rows", "chance")


class StageError(RuntimeError):
    """A failure, labelled with the side that failed (kvpress's own run or latentwire's recording)."""


@contextmanager
def stage(what: str):
    try:
        yield
    except Exception as e:
        raise StageError(f"{what}: {type(e).__name__}: " + (str(e).splitlines() or [""])[0]) from e


def kept_rows(full: torch.Tensor, pruned: torch.Tensor) -> torch.Tensor:
    """Unpruned keys (H, T, D), pruned keys (H, k, D) -> (H, T) bool: the rows kept, by exact byte match."""
    H, T, D = full.shape
    w = torch.randint(1, 1 << 31, (D * full.element_size(),), generator=torch.Generator().manual_seed(0))
    w = w.to(full.device)
    row_hash = lambda x: (x.contiguous().view(torch.uint8).long() * w).sum(-1)  # noqa: E731  (H, n, bytes) -> (H, n)
    sorted_full, order = row_hash(full).sort(-1)  # (H, T)
    hp = row_hash(pruned)  # (H, k)
    lo, hi = torch.searchsorted(sorted_full, hp), torch.searchsorted(sorted_full, hp, right=True)
    if not bool((hi - lo == 1).all()):
        raise RuntimeError("a kept key matches no row, or several rows, of the unpruned cache")
    idx = order.gather(-1, lo)  # (H, k) row of each kept key
    if not torch.equal(full.gather(1, idx[..., None].expand(-1, -1, D)), pruned):
        raise RuntimeError("a kept key is not the row it hashes to")
    mask = torch.zeros(H, T, dtype=torch.bool, device=full.device).scatter_(1, idx, True)
    if not bool((mask.sum(-1) == pruned.shape[1]).all()):
        raise RuntimeError("two kept keys are the same row")
    return mask


def top_mask(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scores (L, H, T), k (L, H) -> (L, H, T) bool: the k[l, h] highest rows of each cell."""
    rank = scores.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)  # (L, H, T), 0 = best
    return rank < k[..., None]


@torch.inference_mode()
def scorer_press_runs(agent: Agent, state, name: str) -> tuple[dict, dict[float, torch.Tensor]]:
    """snapkv/h2o/tova/knorm: latentwire's recorded {layer: (H, T)} scores, and per ratio kvpress's own kept
    sets (L_global, H, T) bool, from the same press (the selector's parameters) at that compression ratio."""
    sel, model, layers = get_selector(name), agent.model, _global_layers(state)
    press = sel.make_press(len(state))
    with stage("latentwire's recording"):
        per_layer = record_prefill_layer_scores(agent, state, press, sel.attn_implementation)[0]
    ids = state.token_ids.to(agent.device)[None]  # (1, T)
    kept = {}
    with stage("kvpress's own run"), _quiet_kvpress(), _model_restored(model, sel.attn_implementation):
        full = agent.new_cache()
        model.model(input_ids=ids, **cache_arg(model.model, full), use_cache=True)
        for r in RATIOS:
            pruned = agent.new_cache()
            with dataclasses.replace(press, compression_ratio=r)(model):  # kvpress its own way: prunes the cache
                model.model(input_ids=ids, **cache_arg(model.model, pruned), use_cache=True)
            kept[r] = torch.stack([kept_rows(full.layers[i].keys[0], pruned.layers[i].keys[0]) for i in layers])
    return per_layer, kept


@torch.inference_mode()
def kvzip_runs(agent: Agent, prompt: str) -> tuple[dict, dict[float, torch.Tensor], int]:
    """kvzip: latentwire's {layer: (H, T)} scores, per ratio KVzipPress's own kept sets (L, H, T), its n_sink."""
    sel, model = get_selector("kvzip"), agent.model
    attn_layers, name_or_path = [layer.self_attn for layer in model.model.layers], model.config.name_or_path
    kept, n_sink = {}, 0
    with _quiet_kvpress(), _model_restored(model, "sdpa" if model.config._attn_implementation == "eager" else None):
        state = agent.prefill(prompt)  # under the attention kvpress's run uses
        ids = state.token_ids.to(agent.device)[None]  # (1, T)
        try:
            with stage("kvpress's own run"), tempfile.TemporaryDirectory() as tmp:
                agent.tokenizer.save_pretrained(tmp)  # KVzipPress.__call__ loads the tokenizer from name_or_path
                model.config.name_or_path = tmp
                for r in RATIOS:
                    press = _kv().KVzipPress(compression_ratio=r, chunk_size=sel.chunk_size,
                                             kvzip_plus_normalization=sel.plus)
                    n_sink = press.n_sink
                    with press(model):
                        model.model(input_ids=ids, **cache_arg(model.model, agent.new_cache()), use_cache=True)
                    keep = torch.ones(len(attn_layers), model.config.num_key_value_heads, ids.shape[1],
                                      dtype=torch.bool, device=agent.device)  # (L, H, T)
                    for i, attn in enumerate(attn_layers):
                        if getattr(attn, "masked_key_indices", None) is None:
                            raise RuntimeError(f"KVzipPress marked no pairs on layer {i}")
                        _, head, row = attn.masked_key_indices  # (batch, KV head, row) of every pruned pair
                        keep[i, head.to(keep.device), row.to(keep.device)] = False
                        del attn.masked_key_indices  # later passes must not mask keys
                    kept[r] = keep
        finally:
            model.config.name_or_path = name_or_path
            for attn in attn_layers:
                attn.__dict__.pop("masked_key_indices", None)
        with stage("latentwire's recording"):
            per_layer = kvzip_layer_scores(agent, state, sel.chunk_size, sel.plus)[0]
    return per_layer, kept, n_sink


def measure(theirs: torch.Tensor, scores: torch.Tensor, row_scores: torch.Tensor, k: int, gold: torch.Tensor) -> dict:
    """kvpress's kept sets (L, H, T) bool, our scores (L, H, T), row scores (T,), k rows, gold rows (G,) -> metrics."""
    ours = top_mask(scores, theirs.sum(-1))  # (L, H, T): kvpress's k of each cell
    worst_kept = scores.masked_fill(~theirs, float("inf")).amin(-1)  # (L, H)
    best_dropped = scores.masked_fill(theirs, float("-inf")).amax(-1)  # (L, H)
    rows = row_scores.topk(k).indices
    inter, union = (theirs & ours).sum(-1), (theirs | ours).sum(-1)  # (L, H)
    return {"identical": float((theirs == ours).all(-1).double().mean()),
            "a_top_k": float((worst_kept >= best_dropped).double().mean()),  # equal up to ties
            "jaccard": float((inter / union.clamp_min(1)).double().mean()),
            "ev_kvpress": float(theirs[..., gold].double().mean()), "ev_ours": float(ours[..., gold].double().mean()),
            "ev_rows": float(torch.isin(gold, rows).double().mean()), "chance": k / theirs.shape[-1]}


def parse_args() -> argparse.Namespace:
    """The command line; --out and --tiny (a tiny random-weight model: a smoke test) are hidden."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default=None, help="model dtype (default: the machine's, as Agent.from_pretrained)")
    ap.add_argument("--task", default="facts")
    ap.add_argument("--n", type=int, default=8, help="documents: one evidence-holding sender of each of n episodes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--presses", default=",".join(PRESSES))
    ap.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                    help="keep episodes whose meta[KEY] == VALUE (a Python literal), repeatable")
    ap.add_argument("--out", default=str(OUT), help=argparse.SUPPRESS)
    ap.add_argument("--tiny", default=None, help=argparse.SUPPRESS)  # tiny random-weight ARCH: a smoke test
    return ap.parse_args()


def load_agent(args: argparse.Namespace) -> Agent:
    """The model under test: --model, or with --tiny ARCH a tiny random-weight one (args.model becomes its name)."""
    if not args.tiny:
        return Agent.from_pretrained(args.model, dtype=args.dtype)
    from latentwire.models import tiny_model, tiny_tokenizer

    torch.set_num_threads(1)
    agent = Agent(tiny_model(args.tiny, max_position_embeddings=1 << 15), tiny_tokenizer(), f"tiny-{args.tiny}")
    args.model = agent.model_name
    return agent


def gold_rows(agent: Agent, ep, a: int, doc: str, T: int) -> torch.Tensor:
    """(G,) prompt rows of sender `a`'s T-row prompt whose document characters overlap a gold evidence span."""
    spans = [(s.start, s.end) for s in ep.evidence if s.agent == a]
    per_row, _ = document_rows(agent, doc, T)
    gold = [r for r, sp in enumerate(per_row) if sp and any(sp[0] < e and sp[1] > s for s, e in spans)]
    return torch.tensor(gold, dtype=torch.long, device=agent.device)  # (G,) prompt rows of the gold evidence


def press_metrics(agent: Agent, name: str, prompt: str, state, gold: torch.Tensor, per_doc: dict) -> None:
    """Runs press `name` on one prompt both ways and appends its metrics at every ratio to per_doc[(name, r)]."""
    if name == "kvzip":
        per_layer, kept, n_sink = kvzip_runs(agent, prompt)
        layers = list(range(len(per_layer)))  # every layer (kvpress refuses sliding ones)
    else:
        (per_layer, kept), n_sink, layers = scorer_press_runs(agent, state, name), 0, _global_layers(state)
    scores = torch.stack([per_layer[i] for i in layers]).to(agent.device)  # (L, H, T) float64
    scores[..., :n_sink] = float("inf")  # kvzip's sinks: kvpress keeps them whatever their score
    row_scores = _aggregate(per_layer, layers).to(agent.device)  # (T,): latentwire's per-row score
    for r in RATIOS:
        k = compute_n_kept(len(state), r)  # kvpress's rows kept per (layer, KV head)
        per_doc[(name, r)].append(measure(kept[r], scores, row_scores, k, gold))


def failure(e: Exception) -> str:
    """A failed press's reason in one line; a StageError's names the side that failed."""
    return str(e) if isinstance(e, StageError) else f"{type(e).__name__}: " + (str(e).splitlines() or [""])[0]


def run_documents(agent: Agent, episodes: list,
                  names: list[str]) -> tuple[dict, list[dict], dict[str, str], list[str]]:
    """Every press on the first evidence-holding sender's document of each episode: per-document metrics per
    (press, ratio), the documents, the presses that failed (with why) and the episodes skipped (with why)."""
    per_doc = {(p, r): [] for p in names for r in RATIOS}  # (press, ratio) -> per-document metrics
    docs, failed, skipped = [], {}, []
    for j, ep in enumerate(episodes):
        if not ep.evidence:
            skipped.append(f"{ep.id} (no evidence)")
            continue
        a = min(s.agent for s in ep.evidence)
        doc = ep.contexts[a]
        prompt = SENDER_PROMPT.format(document=doc)
        state = agent.prefill(prompt)
        T = len(state)
        gold = gold_rows(agent, ep, a, doc, T)  # (G,)
        if not len(gold):
            skipped.append(f"{ep.id} (no prompt row overlaps the evidence)")
            continue
        docs.append({"episode": ep.id, "agent": a, "rows": T, "gold_rows": len(gold)})
        for name in names:
            if name in failed:
                continue
            try:
                press_metrics(agent, name, prompt, state, gold, per_doc)
            except Exception as e:  # e.g. kvzip on Gemma3: reported in the table, never dropped
                traceback.print_exc()
                failed[name] = failure(e)
                for r in RATIOS:
                    per_doc[(name, r)].clear()
        print(f"[{j + 1}/{len(episodes)}] {ep.id} sender {a}: T={T}, gold rows {len(gold)}  " + "  ".join(
            f"{n}@8× {per_doc[(n, 0.875)][-1]['ev_kvpress']:.2f}/{per_doc[(n, 0.875)][-1]['ev_rows']:.2f}"
            for n in names if n not in failed), flush=True)
    return per_doc, docs, failed, skipped


def command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, every option spelled out."""
    return ("python benchmarks/press_parity.py" + (f" --tiny {args.tiny}" if args.tiny else f" --model {args.model}")
            + (f" --dtype {args.dtype}" if args.dtype else "") + f" --task {args.task} --n {args.n} --seed {args.seed}"
            + f" --presses {args.presses}" + "".join(f" --filter {f}" for f in args.filter))


def page_lines(args: argparse.Namespace, agent: Agent, filters: dict, cmd: str, names: list[str], table: dict,
               failed: dict[str, str], skipped: list[str], docs: list[dict]) -> list[str]:
    """The markdown page: a row per (press, ratio), the failed presses, the skipped episodes, the documents."""
    lines = [f"# kvpress parity and evidence kept ({args.task}" + "".join(f", {k}={v}" for k, v in filters.items())
             + f", {args.model}, {str(agent.dtype).removeprefix('torch.')}, {len(docs)} sender documents)", "",
             f"Command: `{cmd}`", "",
             "Per (layer, KV head) cell: kvpress run its own way vs the top-k of latentwire's recorded scores "
             "(`identical`, `Jaccard`; `a top-k`: kvpress's set is one of the top-k sets of the recorded scores, "
             "i.e. equal up to ties); evidence kept: share of gold (layer, KV head, row) triples kvpress keeps "
             "(`kvpress`) / the recorded top-k keeps (`ours`), and share of gold rows latentwire's aggregated row "
             "selection keeps (`rows`: mean over KV heads and layers, top-k rows); `chance` = k/T. Means over "
             "documents; see the script's docstring.", "",
             "| press | ratio | identical | a top-k | Jaccard | evidence: kvpress | ours | rows | chance |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {n} | {1 / (1 - r):.0f}× ({r}) | " + " | ".join(f"{table[(n, r)][m]:.3f}" for m in METRICS) + " |"
              for n in names if n not in failed for r in RATIOS if (n, r) in table]
    lines += [f"| {n} | all | failed on {args.model}: {why} | | | | | | |" for n, why in failed.items()]
    if skipped:
        lines += ["", "Skipped episodes: " + ", ".join(skipped) + "."]
    lines += ["", "Documents: " + ", ".join(f"{d['episode']}#{d['agent']} (T={d['rows']}, gold {d['gold_rows']})"
                                           for d in docs) + "."]
    return lines


def main() -> None:
    """Run every press both ways on each document, then write the parity page and its JSON."""
    args = parse_args()
    names = args.presses.split(",")
    agent = load_agent(args)
    filters = parse_filters(args.filter)
    episodes = select_episodes(load_task_episodes(args.task), args.n, args.seed, filters)
    per_doc, docs, failed, skipped = run_documents(agent, episodes, names)

    table = {(n, r): {m: statistics.mean(d[m] for d in per_doc[(n, r)]) for m in METRICS}
             for n in names if n not in failed for r in RATIOS if per_doc[(n, r)]}
    tag = "" if args.task == "facts" and not filters else \
        f"_{Path(args.task).stem}" + "".join(f"_{k}{v}" for k, v in filters.items())
    cmd = command(args)
    lines = page_lines(args, agent, filters, cmd, names, table, failed, skipped, docs)
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"press_parity{tag}_{args.model}"
    stem.with_name(stem.name + ".md").write_text("\n".join(lines) + "\n")
    stem.with_name(stem.name + ".json").write_text(json.dumps({
        "command": cmd, "model": args.model, "dtype": str(agent.dtype), "ratios": list(RATIOS),
        "attn_implementation": agent.model.config._attn_implementation,
        "table": {f"{n}@{r}": v for (n, r), v in table.items()},
        "per_document": {f"{n}@{r}": v for (n, r), v in per_doc.items()},
        "failed": failed, "skipped": skipped, "documents": docs, "environment": environment()}, indent=2) + "\n")
    print(f"wrote {stem}.md", file=sys.stderr)


if __name__ == "__main__":
    main()
