"""Layers point down: ``schemas`` <- ``services/core`` <- ``services/runtime`` <- ``services/<kind>`` <- ``roundhouse``.

Every module of the shipped packages is parsed (not imported) with ``ast``; every import counts,
including imports inside functions and ``import_module("...")`` with a literal name, because a lazy
import is still a dependency. A contract that two layers share belongs in the lower one
(docs/architecture.md, "Layout").
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("schemas", "services", "roundhouse")
SERVICE_KINDS = ("admission", "scheduler", "placement", "metrics", "worker")

# Known violations, (importing module, imported module). Empty: the cost model and the simulator's
# forward API moved below services/ (services/core/costs.py, services/core/simulation/). Add nothing:
# move the shared contract down instead.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Iterator[tuple[str, Path]]:
    for top in SHIPPED:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield _module_name(path), path


def _imports(module: str, path: Path) -> Iterator[str]:
    """Every module name ``module`` imports, absolute."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                yield ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.module
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _forbidden(module: str) -> tuple[str, ...]:
    """What ``module`` may not import, by the layer it is in."""
    shipped_kinds = tuple(f"services.{k}" for k in SERVICE_KINDS)
    rules: tuple[str, ...] = ("tests",)  # test harnesses and fakes live under tests/, not in the wheel
    if _under(module, "schemas"):
        rules += ("services", "roundhouse")
    elif _under(module, "services.core"):
        rules += ("roundhouse", "services.runtime", *shipped_kinds)
    elif _under(module, "services.runtime"):
        rules += ("roundhouse", *shipped_kinds)
    elif _under(module, "services"):
        rules += ("roundhouse",)
    return rules


def _violations() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for module, path in _modules():
        forbidden = _forbidden(module)
        found.update((module, name) for name in _imports(module, path) if _under(name, *forbidden))
    return found


@pytest.fixture(scope="module")
def violations() -> set[tuple[str, str]]:
    return _violations()


def test_the_walk_sees_the_layers() -> None:
    modules = dict(_modules())
    for expected in ("schemas.jobs", "services.core.registry", "services.runtime.bus", "roundhouse.cli"):
        assert expected in modules
    imports = set(_imports("roundhouse.cli", modules["roundhouse.cli"]))
    assert "services.runtime.version" in imports or "roundhouse" in imports


def test_every_import_points_down(violations: set[tuple[str, str]]) -> None:
    new = sorted(violations - ALLOWED)
    assert not new, (
        "imports that point up a layer (schemas <- services/core <- services/runtime <- services/<kind> <- "
        "roundhouse; nothing shipped imports tests): move the shared contract down instead:\n"
        + "\n".join(f"  {module} imports {name}" for module, name in new)
    )


@pytest.mark.parametrize(
    ("module", "source", "imported"),
    [
        pytest.param("services.core.x", "from services.scheduler.policies import las", "services.scheduler.policies",
                     id="core-imports-a-service"),
        pytest.param("services.worker.x", "from roundhouse import __version__", "roundhouse", id="service-imports-cli"),
        pytest.param("schemas.x", "def f():\n    import services.core\n", "services.core", id="lazy-import"),
        pytest.param("services.core.x", "import_module('services.placement.policies')", "services.placement.policies",
                     id="import-module-literal"),
        pytest.param("roundhouse.sim.x", "from tests.unit.policies import builders", "tests.unit.policies",
                     id="shipped-imports-tests"),
    ],
)
def test_the_rules_catch(module: str, source: str, imported: str, tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text(source)
    names = set(_imports(module, path))
    assert imported in names
    assert _under(imported, *_forbidden(module))


def test_relative_imports_resolve(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text("from ..runtime import bus\nfrom . import state\n")
    assert set(_imports("services.core.x", path)) == {"services.runtime", "services.core"}
