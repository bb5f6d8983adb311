"""The registries find policy packages through entry points, import them lazily, and each package
imports all of its modules; ``services.core`` itself names no service."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.registry import PolicyPackageError, Registry, UnknownPolicyError

CURRENT: Registry[Any] | None = None
"""The scratch registry the fake plugin package below registers into."""


def _install_fake_distribution(root: Path, group: str, package: str, modules: dict[str, str]) -> None:
    """A distribution as ``pip install`` leaves it: a dist-info with an entry point, and the package."""
    dist = root / f"{package}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\nextra = {package}\n")
    pkg = root / package
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from services.core.registry import import_submodules\n\nimport_submodules(__name__, __path__)\n"
    )
    for name, source in modules.items():
        (pkg / f"{name}.py").write_text(textwrap.dedent(source))


def _policy_module(name: str) -> str:
    return f"""
        import tests.unit.core.test_registry as t

        @t.CURRENT.register({name!r})
        class Policy:
            name = {name!r}
    """


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Registry[Any], str, Path]]:
    group = f"roundhouse.test-{uuid.uuid4().hex[:8]}"
    package = f"rh_plugin_{uuid.uuid4().hex[:8]}"
    registry: Registry[Any] = Registry("scheduling", group=group)
    monkeypatch.setattr(sys.modules[__name__], "CURRENT", registry)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield registry, package, tmp_path
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def test_an_installed_package_adds_its_policies_module_by_module(plugin: tuple[Registry[Any], str, Path]) -> None:
    registry, package, root = plugin
    _install_fake_distribution(
        root, registry._group or "", package, {"alpha": _policy_module("alpha"), "beta": _policy_module("beta")}
    )
    assert package not in sys.modules  # nothing is imported before the first lookup
    assert registry.names() == ["alpha", "beta"]  # no list of modules anywhere: each one registers itself
    assert registry.create("beta").name == "beta"


def test_a_package_that_fails_to_import_is_named_and_tried_again(plugin: tuple[Registry[Any], str, Path]) -> None:
    registry, package, root = plugin
    _install_fake_distribution(root, registry._group or "", package, {"broken": "raise RuntimeError('oops')\n"})
    with pytest.raises(PolicyPackageError, match=rf"policy package '{package}' .* of {package}\) failed.*oops"):
        registry.names()
    (root / package / "broken.py").write_text(textwrap.dedent(_policy_module("fixed")))
    assert registry.names() == ["fixed"]


def test_an_unknown_name_lists_the_valid_ones() -> None:
    registry: Registry[Any] = Registry("placement", group=None)
    registry.register("one")(dict)
    with pytest.raises(UnknownPolicyError, match=r"unknown placement policy 'two'; valid: one$"):
        registry.create("two")
    empty: Registry[Any] = Registry("placement", group="roundhouse.test-nothing-declared")
    with pytest.raises(UnknownPolicyError, match=r"valid: \(none\) \(no package declares policies in entry-point "
                       r"group 'roundhouse.test-nothing-declared': is roundhouse installed\?"):
        empty.create("two")


def test_a_name_registered_twice_is_an_error() -> None:
    registry: Registry[Any] = Registry("victim", group=None)
    registry.register("x")(dict)
    registry.register("x")(dict)  # the same factory again (a module imported twice) is fine
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("x")(list)


def test_roundhouse_declares_its_policy_packages_and_core_imports_none() -> None:
    code = textwrap.dedent("""
        import sys
        from importlib.metadata import entry_points
        import services.core
        assert not [m for m in sys.modules if m.endswith(".policies")], "importing services.core loaded policies"
        values = {p.value for p in entry_points(group="roundhouse.policies")}
        assert {"services.admission.policies", "services.scheduler.policies",
                "services.placement.policies"} <= values, values
        services.core.SCHEDULING.names()
        assert "services.scheduler.policies.las" in sys.modules
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
