"""The house's layers: every import of every module of the packages is one that the layer table of
docs/architecture.md allows. The table is read from the document itself (the table under its LAYERS
marker), so that the document and this test cannot drift: a new module, a new layer or a new arrow
between layers is a change of that table."""

import ast
import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
MARKER = "<!-- LAYERS"  # the line above the table
EVERYTHING, NOTHING = "everything below", "nothing"  # what a "may import" cell may say instead of layers


class Layer(NamedTuple):
    name: str
    rooms: tuple[str, ...]  # files, and folders as "dir/", from the project's root
    may_import: tuple[str, ...]  # the layers it may import besides itself


def _words(cell: str) -> tuple[str, ...]:
    return tuple(w for w in re.split(r"[\s,]+", cell.replace("`", "")) if w)


def read_layers(text: str) -> list[Layer]:
    """The rows of the table under MARKER, top floor first: | layer | rooms | may import |."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(MARKER)), None)
    assert start is not None, f"{DOC.name} has no line starting {MARKER!r} above its layer table"
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        name, rooms, allowed = (c.strip() for c in line.strip().strip("|").split("|"))
        if name != "layer" and not set(name) <= set("-: "):  # not the header nor its rule
            rows.append((name.strip("*`"), _words(rooms), allowed))
    names = [name for name, _, _ in rows]
    below = {name: tuple(names[i + 1 :]) for i, name in enumerate(names)}
    return [
        Layer(name, rooms, below[name] if allowed == EVERYTHING else () if allowed == NOTHING else _words(allowed))
        for name, rooms, allowed in rows
    ]


LAYERS = read_layers(DOC.read_text(encoding="utf-8"))
PACKAGES = sorted({room.split("/")[0] for layer in LAYERS for room in layer.rooms})


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def layer_of(path: Path) -> Layer | None:
    """The layer of the room that holds `path` most closely (a file's own row before its folder's)."""
    rel = path.relative_to(ROOT).as_posix()
    held = [(len(room), layer) for layer in LAYERS for room in layer.rooms if rel == room or rel.startswith(room)]
    return max(held, key=lambda pair: pair[0])[1] if held else None


def _resolve(name: str) -> str | None:
    """The project's module that importing `name` loads (a name defined in a module: that module), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every project module that `path` imports: at the top, inside a function, or by
    importlib.import_module of a constant name."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(part for part in (base, node.module) if part)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            arg = node.args[0] if node.args else None
            names = [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else []
        found += [(node.lineno, target) for target in map(_resolve, names) if target not in (None, module)]
    return found


def test_the_layer_table_is_a_house():
    """Layers named once, every room in the project, and each layer importing only layers below it."""
    names = [layer.name for layer in LAYERS]
    assert len(LAYERS) > 5 and len(set(names)) == len(names), f"the layers are named once each: {names}"
    for i, layer in enumerate(LAYERS):
        up = [name for name in layer.may_import if name not in names[i + 1 :]]
        assert not up, f"{layer.name} may import {up}: no layers below it in {DOC.name}'s table"
        for room in layer.rooms:
            assert (ROOT / room).exists() and room.endswith("/") == (ROOT / room).is_dir(), (
                f"{layer.name}'s room {room!r} is not in the project (a folder's name ends in '/')"
            )


def test_every_module_is_in_a_layer():
    lost = [p.relative_to(ROOT).as_posix() for p in MODULES.values() if layer_of(p) is None]
    assert not lost, f"modules in no room of {DOC.name}'s layer table (add them to a layer's rooms): {lost}"


def test_every_import_follows_the_layers():
    wrong = []
    for path in MODULES.values():
        layer, rel = layer_of(path), path.relative_to(ROOT).as_posix()
        for line, target in imports_of(path):
            other = layer_of(MODULES[target])
            if None not in (layer, other) and other.name != layer.name and other.name not in layer.may_import:
                wrong.append(f"{rel}:{line} imports {target} ({layer.name} → {other.name})")
    assert not wrong, (
        f"imports that the layer table of {DOC.name} does not allow; move the name down to a layer both sides may "
        "import, or change the table and say why:\n" + "\n".join(wrong)
    )
