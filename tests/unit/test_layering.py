"""The package's one direction of dependency (docs/architecture.md), read from the source with `ast`: no module
imports a layer above its own, and no two modules import each other, directly or round a longer circle. Imports
inside functions count (they are circles of design even when Python resolves them lazily); imports under
`if TYPE_CHECKING:` do not (annotations only)."""
from __future__ import annotations

import ast
from pathlib import Path

import latentwire

ROOT = Path(latentwire.__file__).resolve().parent
# Lowest first. A module may import its own layer's modules and any layer below; the last column is what lives there.
LAYERS = [
    {"errors", "registry", "placement", "rope", "message", "clock"},  # leaves: names, devices, RoPE, messages, time
    {"models"},
    {"state"},
    {"agent", "replies", "attention", "blend", "templates"},
    {"select", "merge", "translate", "wire"},
    {"protocols"},
    {"demo", "transport"},
    {"bench"},
    {"training"},
    {"integrations"},
    {"cli"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imports() -> dict[str, set[str]]:
    """Module -> the latentwire modules it imports (package modules resolved to the submodule named)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.split(".")[0] == "latentwire"}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.split(".")[0] != "latentwire":
                    continue
                subs = {f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules}
                targets |= subs or {module}
        graph[name] = {t for t in targets if t != name}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_sits_in_a_named_layer():
    unknown = sorted({_layer(m) for m in _modules()} - set(RANK) - {""})
    assert not unknown, f"modules outside LAYERS (add them where they belong): {unknown}"


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{a} -> {b}" for a, targets in imports().items() for b in targets
                    if _layer(a) and _layer(b) and RANK[_layer(b)] > RANK[_layer(a)])
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_circle():
    graph = imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                circles.append(" -> ".join(path[path.index(nxt):] + [node, nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    # a package's __init__ re-exporting its own submodules is not a circle of design: drop package -> own child
    real = [c for c in circles if not all(b.startswith(a + ".") or a.startswith(b + ".")
                                          for a, b in zip(c.split(" -> "), c.split(" -> ")[1:]))]
    assert not real, "import circles:\n" + "\n".join(real)


def test_the_checker_sees_imports_and_circles():
    """The rules above can fail: this file's own parser finds a known import and a known layer."""
    graph = imports()
    assert "latentwire.state" in graph["latentwire.agent"]
    assert "latentwire.wire" in graph["latentwire.transport.base"]  # `from .. import wire` inside a function
    assert "latentwire.agent" not in graph["latentwire.replies"]  # under TYPE_CHECKING only
    assert RANK["cli"] > RANK["bench"] > RANK["protocols"] > RANK["agent"] > RANK["models"]
