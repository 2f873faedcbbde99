"""Layers point one way: protocols <- actors <- supervisors (STYLE.md, rule 1)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("protocols", "actors", "supervisors")
# what each layer may not import
FORBIDDEN = {"protocols": {"actors", "supervisors"}, "actors": {"supervisors"}, "supervisors": set()}


def _layer(dotted: str) -> str:
    """The project layer a dotted name is in: `actor_run.actors.base` and `actors.base` are both `actors`."""
    parts = dotted.split(".")
    return parts[1] if parts[0] == "actor_run" and len(parts) > 1 else parts[0]


def imported_packages(source: str, module: str) -> set[str]:
    """The project layers a module's source imports (at any depth, relative ones resolved)."""
    found: set[str] = set()
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(_layer(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = [*base, *(node.module.split(".") if node.module else [])]
                if target:
                    found.add(_layer(".".join(target)))
            elif node.module:
                found.add(_layer(node.module))
    return found & set(LAYERS)


def wrong_way_arrows(root: Path) -> list[str]:
    bad = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root)
            module = ".".join(rel.with_suffix("").parts)
            for target in sorted(imported_packages(path.read_text(), module) & FORBIDDEN[layer]):
                bad.append(f"{rel} imports {target}")
    return bad


def test_layers_point_one_way() -> None:
    assert wrong_way_arrows(ROOT) == []


def test_every_layer_has_modules_to_check() -> None:
    for layer in LAYERS:
        assert list((ROOT / layer).rglob("*.py")), layer


def test_the_checker_sees_wrong_way_arrows(tmp_path: Path) -> None:
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / "protocols" / "ok.py").write_text("import msgspec\nfrom protocols.failures import Code\n")
    (tmp_path / "protocols" / "bad.py").write_text("def f():\n    from actor_run.actors.base import Actor\n")
    (tmp_path / "actors" / "bad.py").write_text("import actor_run.supervisors.ledger\n")
    (tmp_path / "actors" / "rel.py").write_text("from . import base\nfrom ..supervisors import job\n")
    (tmp_path / "supervisors" / "ok.py").write_text("from actors import Actor\nimport protocols\n")
    assert sorted(wrong_way_arrows(tmp_path)) == [
        "actors/bad.py imports supervisors",
        "actors/rel.py imports supervisors",
        "protocols/bad.py imports actors",
    ]
