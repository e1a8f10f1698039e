"""The layers import downwards only (docs/ARCHITECTURE.md, "Layers"): each package of stratalog may import
its own modules and those of lower layers, never a higher one, lazily inside a function included. A new
import that points up fails here with the module and the line, so the layering is kept, not just drawn."""

from __future__ import annotations

import ast
from pathlib import Path

import stratalog

#: Lowest first. Packages in one layer may not import each other, except as PEERS says.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "invariant", "records", "caching", "native", "lazy"}),   # shared types and helpers,
                                                       # no I/O; which core runs (compiled or Python)
    frozenset({"io", "retrying", "free_space"}),       # devices and libc: the only pread/pwrite/fdatasync;
                                                       # retries with backoff; free space and headroom
    frozenset({"objects"}),                            # object storage: a local directory, any S3 API
    frozenset({"wal"}),                                # the write-ahead logs: on a device, in objects
    frozenset({"kafka"}),                              # Kafka's wire and record-batch formats, sans-I/O
    frozenset({"datadir"}),                            # a store's directory: lock and object store
    frozenset({"engine"}),                             # StreamStore
    frozenset({"cluster"}),                            # leases and holders in PostgreSQL
    frozenset({"queues", "broker"}),                   # QueueStore; the Kafka-compatible broker
    frozenset({"spark", "admin", "console"}),          # the data source and its jobs; Kafka admin clients;
                                                       # the broker's web console
    frozenset({"chaos", "bench", "commands", "cli", "__init__"}),   # tools on top of it all
)
#: Imports across one layer that are allowed, with why.
PEERS: dict[tuple[str, str], str] = {
    ("bench", "chaos"): "benches reuse the kill -9 harness's child processes",
    ("commands", "bench"): "the CLI runs benches",
    ("commands", "chaos"): "the CLI runs the harnesses",
    ("cli", "commands"): "the CLI's subcommands",
}

ROOT = Path(stratalog.__file__).parent


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _layer(package: str) -> int:
    for number, members in enumerate(LAYERS):
        if package in members:
            return number
    raise AssertionError(f"package {package!r} is in no layer: add it to LAYERS (and to docs/ARCHITECTURE.md)")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported package) for every import of a stratalog module in ``path``, lazy ones included.
    A bare ``import stratalog`` (for the package's own path) names no layer and is left out."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "stratalog" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def test_every_package_is_in_a_layer() -> None:
    packages = {_package(p) for p in ROOT.rglob("*.py")}
    for package in packages:
        _layer(package)
    assert packages >= {"io", "wal", "engine", "queues", "broker", "spark"}


def test_imports_point_down_the_layers() -> None:
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        package = _package(path)
        for line, target in _imports(path):
            if target == package or (package, target) in PEERS:
                continue
            if _layer(target) >= _layer(package):
                upward.append(f"{path.relative_to(ROOT)}:{line} ({package}, layer {_layer(package)}) imports "
                              f"{target} (layer {_layer(target)})")
    assert not upward, "imports that point up or across the layers:\n" + "\n".join(upward)


def test_every_allowed_crossing_is_used() -> None:
    crossings = {(_package(p), target) for p in ROOT.rglob("*.py") for _, target in _imports(p)}
    assert set(PEERS) <= crossings, f"PEERS lists crossings nothing makes: {set(PEERS) - crossings}"


def test_the_checker_sees_a_lazy_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from stratalog.broker.topics import parse_stream_name\n")
    assert _imports(module) == [(2, "broker")]


def _runtime_imports_of_modules(path: Path) -> set[str]:
    """The stratalog modules ``path`` imports when it runs: those under ``if TYPE_CHECKING:`` left out."""
    tree = ast.parse(path.read_text(), str(path))
    checking = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                for n in ast.walk(block)}
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
            and node.module.startswith("stratalog.") and id(node) not in checking}


def test_the_api_handlers_do_not_import_the_broker_back() -> None:
    """broker.py registers what api_registry.py gathers from the api_* modules; they name the Broker only
    for the type checker, so broker/ has no import circle."""
    handlers = [*sorted((ROOT / "broker").glob("api_*.py")), ROOT / "broker" / "apis.py"]
    back = {p.name for p in handlers if "stratalog.broker.broker" in _runtime_imports_of_modules(p)}
    assert len(handlers) >= 8 and not back, back


def test_the_circle_checker_sees_an_import_outside_type_checking(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from stratalog.broker.topics import T\n"
                      "from stratalog.broker.broker import Broker\n")
    assert _runtime_imports_of_modules(module) == {"stratalog.broker.broker"}
