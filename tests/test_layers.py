"""The package reads bottom-up: core <- kernels <- adapters <- conformance <- cli. No module imports a layer above
its own (checked statically over every import statement, lazy ones inside functions included), and
docs/architecture.md shows exactly this layering."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import portable_spec

PACKAGE = Path(portable_spec.__file__).parent
ROOT = PACKAGE.parent
# bottom to top; the core is every module directly in portable_spec/
LAYERS = ("core", "kernels", "adapters", "conformance", "cli")


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LAYERS[1:] else "core"


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
        own = LAYERS.index(layer_of(module_name(path)))
        for imported in sorted(imports_of(path)):
            if LAYERS.index(layer_of(imported)) > own:
                bad.append(f"{module_name(path)} ({layer_of(module_name(path))}) imports {imported}")
    return bad


def test_no_module_imports_a_higher_layer():
    assert upward_imports() == []


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The static check would catch a core module that reached up (so the test above can fail)."""
    probe = tmp_path / "portable_spec" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("def f():\n    from .adapters.vllm import plugin\n    import portable_spec.cli\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert imports_of(probe) >= {"portable_spec.adapters.vllm.plugin", "portable_spec.cli"}
    assert layer_of("portable_spec.adapters.vllm.plugin") == "adapters" and layer_of("portable_spec.probe") == "core"


def test_architecture_doc_shows_the_layers():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    stated = re.search(r"Layers, bottom to top: (.+)", doc)
    assert stated, "docs/architecture.md must state 'Layers, bottom to top: ...'"
    assert [s.strip("` ") for s in stated.group(1).split("<-")] == ["portable_spec/*.py (core)"] + [
        f"portable_spec/{layer}/" for layer in LAYERS[1:]]
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name != "__init__.py":
            assert f"  {path.name}" in doc, f"docs/architecture.md does not list core module {path.name}"
