"""docs/architecture.md's maps and walk agree with the code, both ways.

Code → doc: every import contract of pyproject.toml is drawn on the page, with every module it places,
in its layer. Doc → code: every module and package a map names exists in the folder and layer the map
says, every step of the walk names a file and a function that exist (the integration test
tests/integration/test_record_walk.py then checks the steps' order against a real tick), and every
``.py`` file the page names exists.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.architecture_doc import DOC, PACKAGE, ROOT, Entry, LayerMap, layer_maps, walk

#: A file named in backticks: ``engine/worker.py``, ``notifications_retry/api.py``, ``clock.py``.
FILE = re.compile(r"`((?:[\w]+/)*\w+\.py)`")


def contracts() -> list[dict[str, Any]]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])


def contract_layers(contract: Mapping[str, Any]) -> list[set[str]]:
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def map_problems(maps: Sequence[LayerMap], contracts: Sequence[Mapping[str, Any]]) -> list[str]:
    """How the page's maps differ from the contracts (both ways), and the names on them the code lacks."""
    problems = []
    drawn = {m.container: m for m in maps}
    for contract in contracts:
        for container in contract["containers"]:
            page = drawn.get(container)
            if page is None:
                problems.append(f"{container}: no map on the page")
                continue
            code = contract_layers(contract)
            doc = [{entry.name for entry in layer} for layer in page.layers]
            if doc != code:
                problems.append(f"{container}: the page draws {doc}, the contract says {code}")
    placed = {c for contract in contracts for c in contract["containers"]}
    for page in maps:
        if page.container not in placed:
            problems.append(f"{page.container}: a map no contract has")
        for entry in (e for layer in page.layers for e in layer):
            if not entry_exists(page.folder, entry):
                kind = "package" if entry.package else "module"
                problems.append(f"{page.container}: no {kind} {entry.name}")
    return problems


def entry_exists(folder: Path, entry: Entry) -> bool:
    if entry.package:
        return (folder / entry.name / "__init__.py").is_file()
    return (folder / f"{entry.name}.py").is_file()


def defines(path: Path, qualname: str) -> bool:
    """Whether ``path`` defines ``qualname`` (``function`` or ``Class.method``) at its top level."""
    scope: Sequence[ast.stmt] = ast.parse(path.read_text()).body
    for part in qualname.split("."):
        found = [
            node
            for node in scope
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == part
        ]
        if not found:
            return False
        scope = found[0].body
    return True


def walk_problems(steps: Sequence[tuple[str, str]], maps: Sequence[LayerMap]) -> list[str]:
    """Steps naming a file or a function that does not exist, or a module its folder's map lacks."""
    problems = []
    on_maps = {
        (m.folder, entry.name) for m in maps for layer in m.layers for entry in layer if not entry.package
    }
    for file, name in steps:
        path = PACKAGE / file
        if not path.is_file():
            problems.append(f"{file}: no such file")
        elif not defines(path, name):
            problems.append(f"{file}: defines no {name}")
        if (path.parent, path.stem) not in on_maps:
            problems.append(f"{file}: not on its folder's map")
    return problems


def missing_files(text: str) -> list[str]:
    """The ``.py`` files the text names that do not exist: a path is relative to the package (or to the
    repository when it starts with a top folder of it); a bare file name must exist in the package."""
    missing = []
    for name in sorted(set(FILE.findall(text))):
        first = name.split("/", 1)[0]
        if "/" not in name:
            found = any(PACKAGE.rglob(name))
        elif (ROOT / first).is_dir() and first != "notifications_retry":
            found = (ROOT / name).is_file()
        else:
            found = (PACKAGE / name.removeprefix("notifications_retry/")).is_file()
        if not found:
            missing.append(name)
    return missing


def test_every_contract_is_drawn_and_every_name_on_the_maps_exists() -> None:
    maps = layer_maps()
    assert maps, "docs/architecture.md's Layers section draws no map"
    assert map_problems(maps, contracts()) == []


def test_the_walk_names_files_and_functions_that_exist_where_the_maps_put_them() -> None:
    steps = walk()
    assert len(steps) >= 5, steps
    assert steps[-1][0] == "delivery/finalize.py", "the walk ends with the commit"
    assert walk_problems(steps, layer_maps()) == []


def test_every_file_the_page_names_exists() -> None:
    assert missing_files(DOC.read_text()) == []


# -- the checks see what they are for ----------------------------------------------------------------

PAGE = """# Architecture

## One webhook record, from claim to committed outcome

1. `engine/dispatcher.py`, `Dispatcher.run`: the tick's loop.
2. `engine/dispatcher.py`, `Dispatcher.no_such_method`: a name the file lacks.
3. `engine/no_such_module.py`, `run`: a file that does not exist.

## Layers

```
outbox/
relay.py   # the top
publishers/
```

```
outbox/publishers/
http.py  log.py  rabbitmq.py
base.py
```
"""


def test_the_map_check_sees_a_module_missing_moved_or_invented() -> None:
    outbox = [c for c in contracts() if c["containers"] == ["notifications_retry.outbox"]]
    publishers = [c for c in contracts() if c["containers"] == ["notifications_retry.outbox.publishers"]]
    assert map_problems(layer_maps(PAGE)[:1], outbox) == []
    problems = map_problems(layer_maps(PAGE), publishers)
    assert any("nats_jetstream" in p for p in problems), problems  # on the contract, not on the page
    moved = PAGE.replace(
        "http.py  log.py  rabbitmq.py\nbase.py", "http.py  log.py  nats_jetstream.py\nrabbitmq.py  base.py"
    )
    assert any("the page draws" in p for p in map_problems(layer_maps(moved), publishers))
    invented = PAGE.replace("base.py", "base.py  carrier_pigeon.py")
    assert "notifications_retry.outbox.publishers: no module carrier_pigeon" in map_problems(
        layer_maps(invented), publishers
    )
    wrong_kind = PAGE.replace("publishers/\n```", "publishers.py\n```")
    assert "notifications_retry.outbox: no module publishers" in map_problems(layer_maps(wrong_kind), outbox)
    assert "notifications_retry.outbox: no map on the page" in map_problems([], outbox)


def test_the_walk_check_sees_a_missing_file_or_function() -> None:
    problems = walk_problems(walk(PAGE), layer_maps())
    assert problems == [
        "engine/dispatcher.py: defines no Dispatcher.no_such_method",
        "engine/no_such_module.py: no such file",
        "engine/no_such_module.py: not on its folder's map",
    ]


def test_the_file_check_sees_a_file_that_is_gone() -> None:
    assert missing_files("`engine/worker.py`, `tests/unit/test_layers.py`, `clock.py`") == []
    assert missing_files("`engine/gone.py` and `gone_too.py`, `tests/gone.py`") == [
        "engine/gone.py",
        "gone_too.py",
        "tests/gone.py",
    ]
