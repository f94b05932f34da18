"""`code`: fan-in questions about real Python source (the pinned snapshot in ./stdlib), built with `ast`.

Modules are cut into pieces at top-level statements (big classes at their methods), each piece headed
"# file: NAME.py" (or "# file: NAME.py (lines A-B)" for part of a file). A sender's context is 1-4 pieces.
Single-module questions name the module: a parameter's default, a module-level constant, the expression a
short function returns, a class's base. Cross-module questions do not: which module defines a name, or two
hops (a parameter defaulting to a module constant; the base of a base class, possibly in another module).
Answers are the literal source text (plus the value for strings and non-decimal numbers); evidence is the
whole source line(s), and for `which_module` also the `# file:` header line that names the module (tests/unit/test_tasks.py re-derives every answer from the evidence text alone). Only
source positions and `repr` go into the data (no `ast.unparse`), so the files do not depend on the Python
version. Names defined more than once (in a module, or anywhere for "which module") are never asked about.
"""
from __future__ import annotations

import ast
import collections
import random
import textwrap
from pathlib import Path

from ..episode import Episode, Span

STDLIB = Path(__file__).resolve().parent / "stdlib"  # package data, like ./data
MODULES = ("bisect", "calendar", "colorsys", "fractions", "graphlib", "heapq", "numbers", "shlex", "stat",
           "statistics", "string", "textwrap")
SENDERS = 3
CHARS_PER_TOKEN = 4.2
PIECE_MAX = 2800  # characters: pieces of ~400-700 tokens; a sender gets 1-4 of them
MIN_CHARS, MAX_CHARS = 500 * 4.2, 4000 * 4.2
TARGET_TOKENS = (500, 600, 750, 900, 1200)  # a sender holds ~500-1,300 tokens: keeps the file ~1.35 MB
QUOTA = {"default": 31, "constant": 18, "return": 21, "base": 10, "which_module": 28, "const_default": 6,
         "base_of_base": 6}  # questions per kind for n=120 (the two-hop kinds: every candidate the snapshot has)
SCOPE = {"default": "single", "constant": "single", "return": "single", "base": "single",
         "which_module": "cross", "const_default": "cross", "base_of_base": "cross"}


def parse_snippet(text: str) -> ast.Module | None:
    """Parse whole source lines cut from a file: dedented, with a `pass` body added after a bare header."""
    snippet = textwrap.dedent(text).rstrip("\n") + "\n"
    for cand in (snippet, snippet + "    pass\n"):
        try:
            return ast.parse(cand)
        except SyntaxError:
            pass
    return None


def evaluate(node: ast.AST):
    """A literal, or integer arithmetic on literals (`7*3 - 1`); raises ValueError otherwise."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = evaluate(node.left), evaluate(node.right)
        if isinstance(a, int) and isinstance(b, int):
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(node.op)]
        raise ValueError("not integer arithmetic")
    return ast.literal_eval(node)


def value_aliases(source: str, value) -> list[str]:
    """The literal as written, then its value where that reads differently (unquoted string, decimal int)."""
    out = [source]
    if isinstance(value, str) and value.strip() and value not in out:
        out.append(value)
    if isinstance(value, int) and not isinstance(value, bool) and str(value) != source:
        out.append(str(value))
    return out


class _Module:
    def __init__(self, name: str, root: Path):
        self.name = name
        self.text = (root / f"{name}.py").read_text(encoding="utf-8")
        self.lines = self.text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.encoded = [line.encode("utf-8") for line in self.lines]  # ast column offsets count UTF-8 bytes
        self.tree = ast.parse(self.text)
        self.def_counts, self.store_counts = collections.Counter(), collections.Counter()
        for n in ast.walk(self.tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.def_counts[n.name] += 1
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                self.store_counts[n.id] += 1

    def source(self, node) -> str:
        """Like `ast.get_source_segment`, without re-splitting the file on every call."""
        rows = self.encoded[node.lineno - 1:node.end_lineno]
        if len(rows) == 1:
            return rows[0][node.col_offset:node.end_col_offset].decode("utf-8")
        return b"".join([rows[0][node.col_offset:]] + rows[1:-1] + [rows[-1][:node.end_col_offset]]).decode("utf-8")

    def segment(self, a: int, b: int) -> str:  # lines a..b inclusive, 1-based, without the final newline
        return "".join(self.lines[a - 1:b]).rstrip("\n")

    def header_end(self, node) -> int | None:
        """Last line of a def/class header: the first end line whose text parses with a `pass` body."""
        for e in range(node.lineno, node.body[0].lineno + 1):
            if parse_snippet(self.segment(node.lineno, e)) is not None:
                return e
        return None

    def functions(self):
        """(qualified name, node) for top-level functions and methods of top-level classes, if unique."""
        for n in self.tree.body:
            if isinstance(n, ast.FunctionDef) and self.def_counts[n.name] == 1:
                yield n.name, n
            if isinstance(n, ast.ClassDef) and self.def_counts[n.name] == 1:
                names = collections.Counter(m.name for m in n.body if isinstance(m, ast.FunctionDef))
                for m in n.body:
                    if isinstance(m, ast.FunctionDef) and names[m.name] == 1:
                        yield f"{n.name}.{m.name}", m

    def constants(self) -> dict[str, ast.Assign]:
        out = {}
        for n in self.tree.body:
            if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                    and self.store_counts[n.targets[0].id] == 1 and n.lineno == n.end_lineno):
                out[n.targets[0].id] = n
        return out

    def pieces(self) -> list[tuple[int, int]]:
        """(first, last) line ranges cut at top-level statements (and at methods of classes too big for one)."""
        cuts = []
        for n in self.tree.body:
            start = min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])])
            end_char = self.starts[n.end_lineno]
            if isinstance(n, ast.ClassDef) and end_char - self.starts[start - 1] > PIECE_MAX:
                cuts.append(start)
                cuts += [min([m.lineno] + [d.lineno for d in getattr(m, "decorator_list", [])]) for m in n.body[1:]]
            else:
                cuts.append(start)
        cuts = [1] + [c for c in cuts if c > 1] + [len(self.lines) + 1]
        pieces, a = [], 1
        for prev, c in zip(cuts, cuts[1:]):
            if self.starts[c - 1] - self.starts[a - 1] > PIECE_MAX and prev > a:
                pieces.append((a, prev - 1))
                a = prev
        pieces.append((a, len(self.lines)))
        if len(pieces) > 1 and self.starts[pieces[-1][1]] - self.starts[pieces[-1][0] - 1] < MIN_CHARS:
            pieces[-2:] = [(pieces[-2][0], pieces[-1][1])]  # no tiny tail piece
        return pieces


def _candidates(mods: dict[str, _Module]) -> dict[str, list[dict]]:
    """Every askable question, by kind, in source order. Evidence: list of (module, first line, last line)."""
    out = collections.defaultdict(list)
    everywhere = collections.Counter()
    for m in mods.values():
        everywhere.update(m.def_counts)
    for m in mods.values():
        for c in _module_candidates(m, everywhere):
            out[c["kind"]].append(c)
    for c in _base_of_base_candidates(out["base"], mods):
        out["base_of_base"].append(c)
    return out


def _candidate(kind: str, question: str, answers: list[str], evidence: list[tuple], **meta) -> dict:
    """One question of `kind` (two hops for const_default and base_of_base, else one)."""
    return {"kind": kind, "question": question, "answers": answers, "evidence": evidence,
            "hops": 2 if kind in ("const_default", "base_of_base") else 1, **meta}


def _module_candidates(m: _Module, everywhere: collections.Counter) -> list[dict]:
    """The questions about module `m` (every kind but base_of_base), in source order; `everywhere` counts each
    name's definitions over all modules."""
    consts = m.constants()
    out = _function_candidates(m, consts)
    for n in m.tree.body:
        out += _constant_candidates(m, consts, n)
        out += _definition_candidates(m, everywhere, n)
    return out


def _function_candidates(m: _Module, consts: dict[str, ast.Assign]) -> list[dict]:
    """The default, const_default and return questions about `m`'s unique functions and methods."""
    out = []
    for qual, f in m.functions():
        end = m.header_end(f)
        if end is None:
            continue
        sig = (m.name, f.lineno, end)
        out += _default_candidates(m, consts, qual, f, sig)
        out += _return_candidates(m, qual, f, sig)
    return out


def _defaulted_params(a: ast.arguments) -> list[tuple[ast.arg, ast.expr]]:
    """(parameter, default) for each parameter with a default: positional ones, then keyword-only ones."""
    params = list(zip((a.posonlyargs + a.args)[len(a.posonlyargs + a.args) - len(a.defaults):], a.defaults))
    params += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
    return params


def _default_candidates(m: _Module, consts: dict[str, ast.Assign], qual: str, f: ast.FunctionDef,
                        sig: tuple) -> list[dict]:
    """A default question per short one-line literal default of `f`, a const_default question per default that
    names a module constant of `consts`. `sig`: the evidence of `f`'s header."""
    out = []
    for p, d in _defaulted_params(f.args):
        src = m.source(d)
        if d.lineno != d.end_lineno or len(src) > 40:
            continue
        try:
            out.append(_candidate("default", f"What is the default value of the `{p.arg}` parameter of "
                                  f"`{m.name}.{qual}`?", value_aliases(src, ast.literal_eval(d)), [sig],
                                  none=src == "None"))
        except ValueError:
            if isinstance(d, ast.Name) and d.id in consts:
                out += _const_default_candidates(m, consts[d.id], qual, p, sig)
    return out


def _const_default_candidates(m: _Module, c: ast.Assign, qual: str, p: ast.arg, sig: tuple) -> list[dict]:
    """The const_default question of parameter `p`, whose default names the constant assigned by `c`; [] when
    `c`'s value is neither a literal nor integer arithmetic on literals."""
    try:
        value = evaluate(c.value)
    except ValueError:
        return []
    csrc = m.source(c.value)
    answers = [repr(value)] + ([csrc] if csrc != repr(value) else [])
    return [_candidate("const_default", f"What value does the default of the `{p.arg}` parameter of "
                       f"`{m.name}.{qual}` evaluate to?", answers, [sig, (m.name, c.lineno, c.end_lineno)])]


def _return_candidates(m: _Module, qual: str, f: ast.FunctionDef, sig: tuple) -> list[dict]:
    """The return question of `f` when its body (past a docstring) is one short one-line `return EXPR`, else []."""
    body = f.body[1:] if (f.body and isinstance(f.body[0], ast.Expr)
                          and isinstance(f.body[0].value, ast.Constant)) else f.body
    if not (len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None
            and body[0].lineno == body[0].end_lineno):
        return []
    src = m.source(body[0].value)
    if len(src) > 60:
        return []
    ret = (m.name, body[0].lineno, body[0].lineno)
    return [_candidate("return", f"What expression does `{m.name}.{qual}` return?", [src],
                       [sig] if ret[1] == sig[2] else [sig, ret])]


def _constant_candidates(m: _Module, consts: dict[str, ast.Assign], n: ast.stmt) -> list[dict]:
    """The constant question of top-level statement `n` when it assigns a short int, float, str or bytes
    literal to a constant of `consts` (not a dunder), else []."""
    if not (isinstance(n, ast.Assign) and n.targets[0].__class__ is ast.Name and n.targets[0].id in consts):
        return []
    var = n.targets[0].id
    src = m.source(n.value)
    if var.startswith("__") or len(src) > 40:
        return []
    try:
        value = ast.literal_eval(n.value)
    except ValueError:
        return []
    if not isinstance(value, (int, float, str, bytes)):
        return []
    return [_candidate("constant", f"What value is assigned to the module-level constant `{m.name}.{var}`?",
                       value_aliases(src, value), [(m.name, n.lineno, n.end_lineno)])]


def _definition_candidates(m: _Module, everywhere: collections.Counter, n: ast.stmt) -> list[dict]:
    """For a top-level class or function `n` defined once in `m`: its which_module question (when public and
    defined once in all modules) and, for a class with one base other than `object`, its base question."""
    if not isinstance(n, (ast.ClassDef, ast.FunctionDef)) or m.def_counts[n.name] != 1:
        return []
    end = m.header_end(n)
    if end is None:
        return []
    out = []
    if everywhere[n.name] == 1 and not n.name.startswith("_"):
        what = "class" if isinstance(n, ast.ClassDef) else "function"
        out.append(_candidate("which_module", f"Which module defines the {what} `{n.name}`?",
                              [m.name, f"{m.name}.py"], [(m.name, n.lineno, end)]))
    if isinstance(n, ast.ClassDef) and len(n.bases) == 1 and not n.keywords:
        base = m.source(n.bases[0])
        if base != "object":
            short = base.rsplit(".", 1)[-1]
            out.append(_candidate("base", f"What is the base class of `{m.name}.{n.name}`?",
                                  [base] + ([short] if short != base else []), [(m.name, n.lineno, end)]))
    return out


def _base_of_base_candidates(bases: list[dict], mods: dict[str, _Module]) -> list[dict]:
    """A base_of_base question per base question whose base is a class with exactly one base question of its
    own, in the same module or in the snapshot module that qualifies it."""
    out = []
    for b in bases:
        mod, base = b["evidence"][0][0], b["answers"][0]
        home = base.split(".")[0] if "." in base else mod
        second = [c for c in bases if c["evidence"][0][0] == home
                  and c["question"].endswith(f"`{home}.{base.rsplit('.', 1)[-1]}`?")]
        if home in mods and len(second) == 1:
            cls = b["question"].split("`")[1]
            out.append(_candidate("base_of_base", f"What is the base class of the base class of `{cls}`?",
                                  second[0]["answers"], b["evidence"] + second[0]["evidence"]))
    return out


def _pick(rng: random.Random, cands: dict[str, list[dict]], n: int) -> list[dict]:
    """Quota per kind (scaled to n), round-robin over modules within a kind; `None` defaults at most 1 in 5."""
    total = sum(QUOTA.values())
    want = {k: max(1, round(q * n / total)) for k, q in QUOTA.items()}
    picked = []
    for kind in QUOTA:
        pool = list(cands.get(kind, []))
        rng.shuffle(pool)
        if kind == "default":
            pool.sort(key=lambda c: c["none"])  # stable: non-None first, shuffled within
            nones = [c for c in pool if c["none"]][: want[kind] // 5]
            pool = [c for c in pool if not c["none"]] + nones
        by_mod = collections.defaultdict(list)
        for c in pool:
            by_mod[c["evidence"][0][0]].append(c)
        order = sorted(by_mod)
        rng.shuffle(order)
        take = []
        while len(take) < want[kind] and any(by_mod.values()):
            for mod in order:
                if by_mod[mod] and len(take) < want[kind]:
                    take.append(by_mod[mod].pop(0))
        while len(take) < want[kind] and pool:  # too few distinct questions: reuse (new distractors)
            take.append(pool[len(take) % len(pool)])
        picked += take
    while len(picked) < n:
        picked.append(picked[len(picked) % len(picked)])
    picked = picked[:n]
    rng.shuffle(picked)
    return picked


def generate(seed: int, n: int = 120, root: Path | str | None = None) -> list[Episode]:
    """`n` episodes over the snapshot at `root` (default ./stdlib); a pure function of the seed and files."""
    rng = random.Random(seed)
    mods = {name: _Module(name, Path(root) if root else STDLIB) for name in MODULES}
    pieces = [(name, a, b) for name, m in mods.items() for a, b in m.pieces()]
    return [_episode(rng, i, cand, mods, pieces) for i, cand in enumerate(_pick(rng, _candidates(mods), n))]


def _episode(rng: random.Random, idx: int, cand: dict, mods: dict[str, _Module], pieces: list[tuple]) -> Episode:
    needed = []  # the pieces holding the evidence, each to its own sender
    for mod, a, b in cand["evidence"]:
        p = next(p for p in pieces if p[0] == mod and p[1] <= a and b <= p[2])
        if p not in needed:
            needed.append(p)
    agents = rng.sample(range(SENDERS), len(needed))
    parts: list[list[tuple]] = [[] for _ in range(SENDERS)]
    for p, ag in zip(needed, agents):
        parts[ag].append(p)
    used = set(needed)  # membership only
    for ps in parts:  # top up each sender with other pieces towards a drawn length
        target = rng.choice(TARGET_TOKENS) * CHARS_PER_TOKEN
        while True:
            have = sum(len(_render(mods, p)) + 2 for p in ps)
            if have >= MIN_CHARS and have >= 0.85 * target:
                break
            fits = [p for p in pieces if p not in used and have + len(_render(mods, p)) + 2 <= 1.1 * target]
            if not fits and have < MIN_CHARS:
                fits = [p for p in pieces if p not in used and have + len(_render(mods, p)) + 2 <= MAX_CHARS]
            if not fits:
                break
            ps.append(rng.choice(fits))
            used.add(ps[-1])
        rng.shuffle(ps)
    contexts, offsets = [], {}
    for ag, ps in enumerate(parts):
        text = ""
        for p in ps:
            text += "\n\n" if text else ""
            offsets[p] = (ag, len(text) + len(_header(mods, p)) + 1)  # where the piece's first line starts
            text += _render(mods, p)
        contexts.append(text)
    evidence = []
    for mod, a, b in cand["evidence"]:
        p = next(p for p in needed if p[0] == mod and p[1] <= a and b <= p[2])
        ag, base = offsets[p]
        m = mods[mod]
        start = base + m.starts[a - 1] - m.starts[p[1] - 1]
        evidence.append(Span(ag, start, start + len(m.segment(a, b))))
        if cand["kind"] == "which_module":  # the answer is the module's name: in the piece's header, not its lines
            head = base - len(_header(mods, p)) - 1
            evidence.append(Span(ag, head, head + len(_header(mods, p))))
    meta = {"scope": SCOPE[cand["kind"]], "kind": cand["kind"], "hops": cand["hops"],
            "modules": sorted({e[0] for e in cand["evidence"]}), "senders_needed": len(needed),
            "approx_tokens": [round(len(c) / CHARS_PER_TOKEN) for c in contexts]}
    return Episode(f"code-{idx:04d}", "code", "fanin", cand["question"], list(cand["answers"]), tuple(contexts),
                   tuple(evidence), meta)


def _header(mods: dict[str, _Module], piece: tuple) -> str:
    name, a, b = piece
    whole = a == 1 and b == len(mods[name].lines)
    return f"# file: {name}.py" if whole else f"# file: {name}.py (lines {a}-{b})"


def _render(mods: dict[str, _Module], piece: tuple) -> str:
    name, a, b = piece
    return _header(mods, piece) + "\n" + mods[name].segment(a, b)
