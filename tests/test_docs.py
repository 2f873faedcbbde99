"""The docs live in the repository: every relative link in README.md, CHANGELOG.md and docs/
resolves to a file in it (and an anchor to a heading of that file); nothing points outside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # images too: ![alt](path)
HEADING = re.compile(r"^#+\s+(.*)$", re.MULTILINE)


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^a-z0-9 -]", "", text).replace(" ", "-")


def broken_links(documents: list[Path], root: Path) -> list[str]:
    bad = []
    for doc in documents:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto: (not a file of ours)
                continue
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(root)} -> {target}"
            if not resolved.is_relative_to(root):
                bad.append(f"{where}: outside the repository")
            elif not resolved.exists():
                bad.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in {
                _anchor(h) for h in HEADING.findall(resolved.read_text())
            }:
                bad.append(f"{where}: no such heading")
    return bad


def test_every_relative_link_resolves_inside_the_repository() -> None:
    docs = _documents()
    assert {d.name for d in docs} >= {"README.md", "CHANGELOG.md", "architecture.md", "adding-a-cloud.md",
                                      "batch-file.md"}
    assert broken_links(docs, ROOT) == []
    readme = (ROOT / "README.md").read_text()
    for target in ("docs/architecture.md", "docs/adding-a-cloud.md", "docs/batch-file.md", "CHANGELOG.md"):
        assert f"]({target})" in readme


def test_the_checker_sees_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A title\n\n## Some `code` here\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/a.md) [ok2](docs/a.md#some-code-here) [web](https://example.com) ![img](docs/a.md)\n"
        "[gone](docs/b.md) [out](../shared/DESIGN.md) [anchor](docs/a.md#nothing) [self](#missing)\n"
    )
    assert broken_links([doc], tmp_path) == [
        "README.md -> docs/b.md: no such file",
        "README.md -> ../shared/DESIGN.md: outside the repository",
        "README.md -> docs/a.md#nothing: no such heading",
        "README.md -> #missing: no such heading",
    ]


ARCHITECTURE = ROOT / "docs" / "architecture.md"
NAMED_PATH = re.compile(r"\b((?:protocols|actors|supervisors)/[\w/]*\w(?:\.py|/))")


def test_the_architecture_map_names_the_folders_of_supervisors() -> None:
    """docs/architecture.md's map of folders has every part of supervisors/ (and nothing loose at its
    root), and every path it names exists."""
    text = ARCHITECTURE.read_text()
    parts = sorted(p.name for p in (ROOT / "supervisors").iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert parts == ["api", "cli", "ledger", "tree", "views"]
    for part in parts:
        assert f"\n  {part}/ " in text, f"the map of folders has no supervisors/{part}/"
    missing = sorted({m for m in NAMED_PATH.findall(text) if not (ROOT / m).exists()})
    assert missing == [], f"docs/architecture.md names paths that are gone: {missing}"


def test_the_architecture_walk_goes_down_the_floors() -> None:
    """The newcomer's walk from `actor-run run` to the create call visits cli, api, tree, actors and
    the clouds in that order, never back up."""
    text = ARCHITECTURE.read_text()
    walk = text[text.index("## A walk down the floors"):]
    walk = walk[:walk.index("\n## ", 1)] if "\n## " in walk[1:] else walk
    floors = re.findall(r"^\d+\. \*\*([\w/]+)\*\*", walk, re.MULTILINE)
    assert floors == ["cli/", "api/", "tree/", "actors/", "protocols/clouds/"]
