"""The package reads bottom-up: core <- kernels <- training, bench, adapters <- conformance <- cli. No module imports
a layer above its own or a sibling of its own rank (checked statically over every import statement, lazy ones
inside functions included), and docs/architecture.md shows exactly this layering."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import portable_spec

PACKAGE = Path(portable_spec.__file__).parent
ROOT = PACKAGE.parent
# bottom to top; the layers of one rank never import each other; portable_spec/__init__.py re-exports the core
RANKS = (("core",), ("kernels",), ("training", "bench", "adapters"), ("conformance",), ("cli",))
LAYERS = tuple(layer for rank in RANKS for layer in rank)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "core"  # the package's __init__: the public API, lazily re-exporting the core
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module}: every module lives in a layer subpackage {LAYERS}")
    return parts[1]


def rank_of(layer: str) -> int:
    return next(index for index, rank in enumerate(RANKS) if layer in rank)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of the portable_spec modules `path` imports."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{alias.name}" for alias in node.names} | {base}
    return {m for m in found if m.split(".")[0] == "portable_spec"}


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = layer_of(module_name(path))
        for imported in sorted(imports_of(path) - {"portable_spec"}):
            other = layer_of(imported)
            if rank_of(other) > rank_of(own) or (rank_of(other) == rank_of(own) and other != own):
                bad.append(f"{module_name(path)} ({own}) imports {imported} ({other})")
    return bad


def test_no_module_imports_a_higher_layer():
    assert upward_imports() == []


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The static check would catch a core module that reached up (so the test above can fail)."""
    probe = tmp_path / "portable_spec" / "core" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def f():\n    from ..adapters.vllm import plugin\n    import portable_spec.cli\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert imports_of(probe) >= {"portable_spec.adapters.vllm.plugin", "portable_spec.cli"}
    assert (
        layer_of("portable_spec.adapters.vllm.plugin") == "adapters" and layer_of("portable_spec.core.probe") == "core"
    )
    assert rank_of("training") == rank_of("bench") == rank_of("adapters") > rank_of("kernels")


def test_architecture_doc_shows_the_layers():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    stated = re.search(r"Layers, bottom to top: (.+)", doc)
    assert stated, "docs/architecture.md must state 'Layers, bottom to top: ...'"
    assert [[s.strip("` ") for s in rank.split(",")] for rank in stated.group(1).split("<-")] == [
        [f"portable_spec/{layer}/" for layer in rank] for rank in RANKS
    ]
    assert [p.name for p in PACKAGE.glob("*.py")] == ["__init__.py"], "modules live in the layer subpackages"
    for layer in ("core", "training", "bench"):
        for path in sorted((PACKAGE / layer).glob("*.py")):
            if path.name != "__init__.py":
                assert f"  {path.name}" in doc, f"docs/architecture.md does not list {layer} module {path.name}"


def test_no_import_cycles():
    """Module-level and lazy imports together form no cycle (spec <-> variants was the last one)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                return path + [name, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [name])):
                return cycle
        state[name] = 2
        return None

    cycles = [cycle for name in sorted(graph) if name not in state and (cycle := visit(name, []))]
    assert cycles == []
