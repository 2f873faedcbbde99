"""Layers point one way: protocols <- actors <- supervisors (STYLE.md, rule 1); no import circle
between two modules; the subpackages of supervisors/ keep their rules (each one's __init__ says
them): the ledger knows no command line, view or tree, the views know no ledger backend and no
command line, and only the command line imports the command line."""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("protocols", "actors", "supervisors")
# what each layer may not import
FORBIDDEN = {"protocols": {"actors", "supervisors"}, "actors": {"supervisors"}, "supervisors": set()}


def _layer(dotted: str) -> str:
    """The project layer a dotted name is in: `actor_run.actors.base` and `actors.base` are both `actors`."""
    parts = dotted.split(".")
    return parts[1] if parts[0] == "actor_run" and len(parts) > 1 else parts[0]


def _project(dotted: str) -> str:
    """A dotted name without the `actor_run.` the installed package puts before each layer."""
    return dotted.split(".", 1)[1] if dotted.startswith("actor_run.") else dotted


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[tuple[str, list[str]]]:
    """(the module an import names, the names it takes from it) with relative imports resolved;
    names without `actor_run.`."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield _project(alias.name), []
        return
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        target = ".".join([*base, *(node.module.split(".") if node.module else [])])
    else:
        target = _project(node.module or "")
    if target:
        yield target, [alias.name for alias in node.names]


@functools.cache
def _parsed(source: str) -> tuple[ast.Module, tuple[ast.Import | ast.ImportFrom, ...]]:
    """A source's tree and every import in it, at any depth (each test reads the same files: parsed
    once per process)."""
    tree = ast.parse(source)
    return tree, tuple(n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))


def imported_packages(source: str, module: str) -> set[str]:
    """The project layers a module's source imports (at any depth, relative ones resolved)."""
    found: set[str] = set()
    for node in _parsed(source)[1]:
        found.update(_layer(target) for target, _ in _targets(node, module, False))
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


# --- the modules, and what each imports ------------------------------------------------------------


def project_modules(root: Path) -> dict[str, Path]:
    """Every module of the layers by dotted name (`supervisors.ledger` is its __init__.py)."""
    modules = {}
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level(body: list[ast.stmt], typing_too: bool = True) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports of the module's body, its classes' bodies and any if/try/with in them (with
    `typing_too`, an `if TYPE_CHECKING:` block's too: a circle a type checker reads is coupling all
    the same); never a function's body."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if typing_too or not _is_type_checking(node):
                yield from _module_level(node.body, typing_too)
            yield from _module_level(node.orelse, typing_too)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level(block, typing_too)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _module_level(node.body, typing_too)


def imports_of(root: Path, *, module_level: bool) -> dict[str, set[str]]:
    """module -> the project modules it imports: `from a.b import c` is a.b.c when that is a module
    (else a.b). With `module_level`, only the imports that run at import time."""
    modules = project_modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree, every = _parsed(path.read_text())
        nodes = _module_level(tree.body) if module_level else iter(every)
        found: set[str] = set()
        for node in nodes:
            for target, names in _targets(node, name, path.name == "__init__.py"):
                subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
                if subs:
                    found.update(subs)
                if len(subs) < len(names) or not names:
                    found.add(target)
        graph[name] = {t for t in found if t in modules and t != name}
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """Every circle of module-level imports between project modules (Tarjan's strongly connected
    components of more than one module), each sorted."""
    graph = imports_of(root, module_level=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


# --- the subpackages' rules (at any depth: a function's import counts too) ---------------------------

PARTS = ("api", "cli", "ledger", "tree", "views")  # supervisors/ is these and its __init__, nothing loose
BACKEND = {"supervisors.ledger.db", "supervisors.ledger.txn", "supervisors.ledger.schema"}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _part(name: str) -> Callable[[str], bool]:
    return lambda t: _in(t, f"supervisors.{name}")


# (whose imports, what they may not import, why)
RULES: list[tuple[str, Callable[[str], bool], str]] = [
    ("supervisors.ledger", _part("cli"), "the ledger knows no command line"),
    ("supervisors.ledger", _part("views"), "the ledger knows no view"),
    ("supervisors.ledger", _part("tree"), "the ledger knows nothing of the tree that uses it"),
    ("supervisors.ledger", _part("api"), "the ledger knows nothing of the API that uses it"),
    ("supervisors.tree", _part("api"), "the tree knows nothing of the API that embeds it"),
    ("supervisors.tree", _part("views"), "the tree knows no view"),
    ("supervisors.api", _part("views"), "the embedding API prints nothing: it knows no view"),
    ("supervisors.views", lambda t: t in BACKEND, "a view knows no ledger backend"),
    ("supervisors.views", _part("api"), "a view knows no embedding API"),
    ("supervisors.views", _part("cli"), "a view knows no command line"),
    ("", _part("cli"), "only the command line imports the command line"),
]


def broken_rules(root: Path) -> list[str]:
    bad = []
    for module, targets in sorted(imports_of(root, module_level=False).items()):
        for whose, forbidden, why in RULES:
            if whose and not _in(module, whose):
                continue
            if not whose and _in(module, "supervisors.cli"):
                continue  # the rule is about everyone else
            bad.extend(f"{module} imports {t}: {why}" for t in sorted(targets) if forbidden(t))
    return sorted(bad)


def loose_modules(root: Path) -> list[str]:
    """What lies at supervisors/'s root besides its __init__ and its parts."""
    sup = root / "supervisors"
    return sorted(p.name for p in sup.iterdir()
                  if p.name not in {"__init__.py", "__pycache__", *PARTS} and (p.suffix == ".py" or p.is_dir()))


# --- the tests -------------------------------------------------------------------------------------


def test_layers_point_one_way() -> None:
    assert wrong_way_arrows(ROOT) == []


def test_every_layer_has_modules_to_check() -> None:
    for layer in LAYERS:
        assert list((ROOT / layer).rglob("*.py")), layer
    for package in PARTS:
        assert list((ROOT / "supervisors" / package).glob("*.py")), package


def test_supervisors_is_its_parts_and_nothing_loose(tmp_path: Path) -> None:
    assert loose_modules(ROOT) == []
    (tmp_path / "supervisors" / "tree").mkdir(parents=True)
    (tmp_path / "supervisors" / "__init__.py").write_text("")
    (tmp_path / "supervisors" / "runner.py").write_text("")
    assert loose_modules(tmp_path) == ["runner.py"]


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


def test_no_module_imports_itself_round_a_circle() -> None:
    assert import_cycles(ROOT) == []


SPEC_ROOMS = ("protocols.specs", "protocols.spec_types", "protocols.spec_checks", "protocols.spec_secrets")


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for t in graph.get(todo.pop(), set()) - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_the_specs_know_no_registry_of_clouds() -> None:
    """protocols/clouds builds clouds from specs; specs.py and the rooms behind it (its structs, checks
    and secrets) never import it back, directly or through another module (not even in a function)."""
    graph = imports_of(ROOT, module_level=False)
    assert set(SPEC_ROOMS) <= set(graph)
    assert set(SPEC_ROOMS[1:]) <= reached(graph, "protocols.specs")
    for room in SPEC_ROOMS:
        imports = reached(graph, room)
        assert not any(_in(t, "protocols.clouds") for t in imports), (room, sorted(imports))


def test_the_specs_rooms_are_small() -> None:
    """The batch file's code is split by what it does, each room under the house bound (STYLE.md, 9)."""
    for room in SPEC_ROOMS:
        path = ROOT / (room.replace(".", "/") + ".py")
        assert len(path.read_text().splitlines()) <= 500, path


def test_the_checker_sees_a_circle(tmp_path: Path) -> None:
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / "protocols" / "specs.py").write_text("import msgspec\nfrom actor_run.protocols import clouds\n")
    (tmp_path / "protocols" / "clouds").mkdir()
    (tmp_path / "protocols" / "clouds" / "__init__.py").write_text("from actor_run.protocols.clouds import sim\n")
    (tmp_path / "protocols" / "clouds" / "sim.py").write_text("from ..specs import Job\n")
    (tmp_path / "protocols" / "failures.py").write_text("from actor_run.protocols.specs import Job\n")
    # a circle a type checker reads is one; not circles: an import inside a function, a package's own module
    (tmp_path / "actors" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                              "    from actors.b import B\ndef f():\n    from actors import c\n")
    (tmp_path / "actors" / "b.py").write_text("import actor_run.actors.a\n")
    (tmp_path / "actors" / "c.py").write_text("from actors.a import f\n")
    (tmp_path / "supervisors" / "cli").mkdir()
    (tmp_path / "supervisors" / "cli" / "__init__.py").write_text("from actor_run.supervisors.cli.main import entry\n")
    (tmp_path / "supervisors" / "cli" / "main.py").write_text("from actor_run.supervisors.cli import run\n")
    (tmp_path / "supervisors" / "cli" / "run.py").write_text("import argparse\n")
    assert import_cycles(tmp_path) == [["actors.a", "actors.b"],
                                       ["protocols.clouds", "protocols.clouds.sim", "protocols.specs"]]


def test_the_subpackages_keep_their_rules() -> None:
    assert broken_rules(ROOT) == []


def test_the_checker_sees_each_broken_rule(tmp_path: Path) -> None:
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    sup = tmp_path / "supervisors"
    for package in PARTS:
        (sup / package).mkdir()
        (sup / package / "__init__.py").write_text("")
    for name in ("batch", "budget"):
        (sup / "tree" / f"{name}.py").write_text("")
    for name in ("db", "schema", "reader"):
        (sup / "ledger" / f"{name}.py").write_text("")
    (sup / "api" / "runner.py").write_text("")
    (sup / "cli" / "main.py").write_text("")
    (sup / "views" / "live.py").write_text("")
    # allowed: the ledger's own modules, the tree using the ledger, the api the tree, the command line anything
    (sup / "ledger" / "core.py").write_text("from actor_run.supervisors.ledger import db, schema\nimport protocols\n")
    (sup / "tree" / "job.py").write_text("from actor_run.supervisors.ledger import reader\nfrom . import budget\n")
    (sup / "api" / "handle.py").write_text("from actor_run.supervisors.tree import batch\n")
    (sup / "cli" / "run.py").write_text("from actor_run.supervisors.api import runner\n"
                                        "from actor_run.supervisors.ledger.db import x\nfrom . import main\n"
                                        "import actor_run.supervisors.views.live\n")
    (sup / "views" / "report.py").write_text("from actor_run.supervisors.tree.budget import BudgetStatistics\n"
                                             "from actor_run.supervisors.ledger.reader import LedgerReader\n")
    assert broken_rules(tmp_path) == []
    # each rule broken once (a function's import counts)
    (sup / "ledger" / "sweep.py").write_text("def f():\n    from actor_run.supervisors.cli import main\n")
    (sup / "ledger" / "resume.py").write_text("from ..views.live import View\n")
    (sup / "ledger" / "money.py").write_text("from actor_run.supervisors.tree.batch import BatchSupervisor\n"
                                             "from actor_run.supervisors.api.runner import Runner\n")
    (sup / "tree" / "walk.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from actor_run.supervisors.api.runner import Runner\n"
                                          "from actor_run.supervisors.views import live\n")
    (sup / "api" / "events.py").write_text("from actor_run.supervisors.views.live import View\n")
    (sup / "views" / "runlog.py").write_text("from actor_run.supervisors.ledger.db import resolve\n"
                                             "import actor_run.supervisors.cli\nfrom ..api import runner\n")
    assert broken_rules(tmp_path) == [
        "supervisors.api.events imports supervisors.views.live: the embedding API prints nothing: it knows no view",
        "supervisors.ledger.money imports supervisors.api.runner: the ledger knows nothing of the API that uses it",
        "supervisors.ledger.money imports supervisors.tree.batch: the ledger knows nothing of the tree that uses it",
        "supervisors.ledger.resume imports supervisors.views.live: the ledger knows no view",
        "supervisors.ledger.sweep imports supervisors.cli.main: only the command line imports the command line",
        "supervisors.ledger.sweep imports supervisors.cli.main: the ledger knows no command line",
        "supervisors.tree.walk imports supervisors.api.runner: the tree knows nothing of the API that embeds it",
        "supervisors.tree.walk imports supervisors.views.live: the tree knows no view",
        "supervisors.views.runlog imports supervisors.api.runner: a view knows no embedding API",
        "supervisors.views.runlog imports supervisors.cli: a view knows no command line",
        "supervisors.views.runlog imports supervisors.cli: only the command line imports the command line",
        "supervisors.views.runlog imports supervisors.ledger.db: a view knows no ledger backend",
    ]
