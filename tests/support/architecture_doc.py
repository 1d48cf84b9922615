"""What docs/architecture.md states about the code, read from the page: its layer maps and its walk of
one webhook record. The tests compare both with the code (pyproject.toml's import contracts, the
package's files and definitions, a profiler's trace of a real tick)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "notifications_retry"
WALK_TITLE = "## One webhook record, from claim to committed outcome"
LAYERS_TITLE = "## Layers"
#: A step of the walk: ``1. `engine/dispatcher.py`, `Dispatcher.run`: …``.
STEP = re.compile(r"^\d+\. `(?P<file>[\w/]+\.py)`, `(?P<name>[\w.]+)`", re.M)
CODE_BLOCK = re.compile(r"^```\n(.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Entry:
    """A name on a map: a module (``name.py``) or a package (``name/``) of the map's container."""

    name: str
    package: bool


@dataclass(frozen=True)
class LayerMap:
    """One code block of the Layers section: its container (a folder of the app) and its layers, top first."""

    container: str  # dotted, as pyproject.toml's contracts name it
    folder: Path
    layers: tuple[frozenset[Entry], ...]


def section(title: str, text: str | None = None) -> str:
    """The text of the section ``title`` (up to the next section of the same level)."""
    text = DOC.read_text() if text is None else text
    assert title in text, f"docs/architecture.md has no section {title!r}"
    return text.split(title, 1)[1].split("\n## ", 1)[0]


def walk(text: str | None = None) -> list[tuple[str, str]]:
    """The walk's steps as (file relative to the package, qualified name of the function it names)."""
    return [(m["file"], m["name"]) for m in STEP.finditer(section(WALK_TITLE, text))]


def layer_maps(text: str | None = None) -> list[LayerMap]:
    """Every map of the Layers section. A map's first line names its folder (``notifications_retry/``,
    ``engine/``, ``outbox/publishers/``); each line after it is a layer: names separated by spaces,
    modules ending in ``.py``, packages in ``/``; what follows a ``#`` is a comment."""
    maps = []
    for block in CODE_BLOCK.findall(section(LAYERS_TITLE, text)):
        lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
        lines = [line for line in lines if line]
        head, rows = lines[0], lines[1:]
        assert head.endswith("/") and " " not in head, f"a map starts with its folder, not {head!r}"
        folder = head.rstrip("/")
        relative = "" if folder == "notifications_retry" else folder
        container = ".".join(["notifications_retry", *filter(None, relative.split("/"))])
        layers = []
        for row in rows:
            entries = set()
            for token in row.split():
                assert token.endswith((".py", "/")), (
                    f"{token!r} on the {head} map is neither a module nor a package"
                )
                entries.add(Entry(token.removesuffix(".py").removesuffix("/"), token.endswith("/")))
            layers.append(frozenset(entries))
        maps.append(LayerMap(container, PACKAGE / relative, tuple(layers)))
    return maps
