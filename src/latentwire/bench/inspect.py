"""See what was sent: one episode as an HTML page, selectors side by side.

    latentwire inspect --task facts --episode facts-0005 --selectors cacheback,streaming_llm --ratio 8 --out x.html

Each sender's document is shown once per selector: kept text highlighted (darker = higher score),
gold evidence underlined. `--png` also renders the page with headless Chromium (Debian's `chromium`).
"""
from __future__ import annotations

import html
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ..agent import Agent
from ..errors import LatentWireError
from ..protocols.cacheback import CacheBack, document_rows
from ..select import fanin_budget
from .episode import Episode

_STYLE = """body{font:13px/1.45 system-ui,sans-serif;margin:16px;color:#222}
.grid{display:grid;gap:12px}.doc{white-space:pre-wrap;border:1px solid #ccc;padding:8px;max-height:520px;
overflow:auto;font:12px/1.4 ui-monospace,monospace}u{text-decoration:underline 2px #c00}h3{margin:4px 0}
.meta{color:#666;font-size:12px}"""


def _char_marks(doc: str, rows: torch.Tensor, scores: torch.Tensor, per_row: list) -> list[float]:
    """Per character of the document: the normalised score of the kept row covering it, else 0."""
    marks = [0.0] * len(doc)
    kept = scores[rows].double()
    lo, hi = float(kept.min()), float(kept.max())
    for r, s in zip(rows.tolist(), kept.tolist()):
        span = per_row[r] if r < len(per_row) else None
        if span is not None:
            level = 0.25 + 0.75 * ((s - lo) / (hi - lo) if hi > lo else 1.0)
            marks[span[0]:span[1]] = [level] * (span[1] - span[0])
    return marks


def _render(doc: str, marks: list[float], gold: list[bool]) -> str:
    out, i = [], 0
    while i < len(doc):
        j = i
        while j < len(doc) and marks[j] == marks[i] and gold[j] == gold[i]:
            j += 1
        text = html.escape(doc[i:j])
        if gold[i]:
            text = f"<u>{text}</u>"
        if marks[i]:
            text = f'<span style="background:rgba(255,170,0,{marks[i]:.2f})">{text}</span>'
        out.append(text)
        i = j
    return "".join(out)


EXPLAIN = ("Rows: a sender's T rows are its prompt (template + document) and its G latent rows. It sends at most "
           "B = ceil(T / ratio) document rows (the budget), plus its first row and its G latent rows, which are "
           "always sent: rows sent = document rows + first + latent. Compression = the document's rows ÷ the "
           "document rows sent (as `bench report` records it); it is below the ratio because B is taken over all "
           "T rows, template and latent rows included, while only document rows fill it.")


def sent_summary(state, rows: torch.Tensor, eligible: torch.Tensor) -> str:
    """"31 rows sent = 22 document + 1 first + 8 latent · compression 5.55× (122 ÷ 22 document rows)"."""
    n_lat, n_doc = int(state.is_latent[rows].sum()), int(eligible[rows].sum())
    other, total = len(rows) - n_lat - n_doc, int(eligible.sum())
    return (f"{len(rows)} rows sent = {n_doc} document + {other} first + {n_lat} latent · compression "
            f"{total / max(1, n_doc):.2f}× ({total} ÷ {n_doc} document rows)")


def inspect_protocols(selectors: list[str], ratio: float, latent_steps: int) -> dict[str, CacheBack]:
    """Each selector's CacheBack variant (SELECTOR[@PRESET][+CALIBRATION][/sentence][:FIELD=VALUE], see
    `CacheBack.variant`): a bad name or field is refused here, before any model loads or any sender reads."""
    return {name: CacheBack.variant(name, ratio=ratio, latent_steps=latent_steps) for name in selectors}


def inspect_episode(agent: Agent, ep: Episode, selectors: list[str], ratio: float, latent_steps: int) -> str:
    protos = inspect_protocols(selectors, ratio, latent_steps)
    reader = CacheBack(latent_steps=latent_steps)
    cols = len(selectors)
    parts = [f"<!doctype html><meta charset=utf-8><title>{html.escape(ep.id)}</title><style>{_STYLE}</style>",
             f"<h2>{html.escape(ep.id)}: {html.escape(ep.question)}</h2>",
             f"<p class=meta>gold: {html.escape(str(ep.answers))} · model {agent.model_name} · ratio {ratio}× · "
             f"G = {latent_steps} · highlight = kept (darker = higher score), underline = gold evidence</p>",
             f"<p class=meta>{html.escape(EXPLAIN)}</p>"]
    for a, doc in enumerate(ep.contexts):
        gold = [False] * len(doc)
        for s in ep.evidence:
            if s.agent == a:
                gold[s.start:s.end] = [True] * (s.end - s.start)
        state = reader.read(agent, doc)
        per_row, eligible = document_rows(agent, doc, len(state))
        T, n_doc, budget = len(state), int(eligible.sum()), fanin_budget(len(state), ratio)
        parts.append(f"<h3>sender {a}: T = {T} rows ({T - latent_steps} prompt, {n_doc} of them document, + "
                     f"{latent_steps} latent); budget B = ceil({T} / {ratio:g}) = {budget} document rows</h3>"
                     f"<div class=grid style='grid-template-columns:repeat({cols},1fr)'>")
        for name, proto in protos.items():
            rows = proto.choose(agent, state, ep.question, eligible, proto.span_groups(per_row, doc), per_row, doc)
            text = proto.attention is None  # lexical, bm25, dense: kept units shaded alike
            scores = torch.ones(len(state), device=state.device) if text else proto.scores(agent, state, ep.question)
            body = _render(doc, _char_marks(doc, rows, scores, per_row), gold)
            summary = html.escape(sent_summary(state, rows, eligible))
            said = proto.said(agent, state, ep.question)  # the answer probe's tokens joined the question's
            probe = "" if said is None else f"<br><span class=meta>probe: {html.escape(repr(said))}</span>"
            parts.append(f"<div><b>{html.escape(name)}</b> <span class=meta>{summary}</span>{probe}"
                         f"<div class=doc>{body}</div></div>")
        parts.append("</div>")
    return "\n".join(parts)


def chromium() -> str:
    """The headless browser `screenshot` uses; a clear error when it is not installed (check before computing)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise LatentWireError("--png needs Debian's chromium: apt-get install -y chromium (or drop --png: the HTML "
                              "page is written without it)")
    return exe


def screenshot(html_path: Path, png_path: Path, width: int = 1600, height: int = 2000) -> Path:
    """Render with headless Chromium; a clear error when it is not installed."""
    exe = chromium()
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                        f"--window-size={width},{height}", f"--screenshot={png_path.resolve()}",
                        html_path.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    return png_path
