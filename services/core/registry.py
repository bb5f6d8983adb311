"""One name registry per policy kind. Services and the simulator pick policies by these names.

How a policy gets here, with ``services.core`` knowing no service:

1. A policy module registers its factory with a decorator, ``@SCHEDULING.register("las")``.
2. A *policy package* imports every module it contains when it is imported
   (:func:`import_submodules` in its ``__init__.py``), so a new policy is one new module.
3. Policy packages are declared as Python entry points in the group ``roundhouse.policies``
   (Roundhouse's own in ``pyproject.toml``; any installed distribution may add its own). The
   registries import them on their first lookup (``names``, ``create``, ``check``), not on import,
   so importing ``services.core`` stays cheap.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, Final, Generic, TypeVar

from services.core.protocols import AdmissionPolicy, PlacementPolicy, SchedulingPolicy, VictimPolicy

T = TypeVar("T")

ENTRY_POINT_GROUP: Final = "roundhouse.policies"
"""Entry-point group whose values are policy packages to import (``name = "package.module"``)."""


class UnknownPolicyError(LookupError):
    """A policy name that is not registered; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: list[str], *, group: str | None = None) -> None:
        hint = ""
        if not valid and group is not None:
            hint = (f" (no package declares policies in entry-point group {group!r}: is roundhouse installed? "
                    "`pip install -e .` in a source tree)")
        super().__init__(f"unknown {kind} policy {name!r}; valid: {', '.join(valid) or '(none)'}{hint}")
        self.kind = kind
        self.name = name
        self.valid = valid


class PolicyPackageError(ImportError):
    """A policy package declared as an entry point failed to import; names the package and its distribution."""


_loaded_groups: set[str] = set()


def load_policy_packages(group: str = ENTRY_POINT_GROUP) -> None:
    """Import every policy package declared in ``group``, once per process.

    A package that fails to import raises :class:`PolicyPackageError`; the next lookup tries again.
    """
    if group in _loaded_groups:
        return
    _loaded_groups.add(group)  # first, so a policy module that looks a name up while loading does not recurse
    try:
        for point in sorted(entry_points(group=group), key=lambda p: (p.name, p.value)):
            try:
                import_module(point.value)
            except Exception as exc:
                source = point.dist.name if point.dist is not None else "an unknown distribution"
                raise PolicyPackageError(
                    f"policy package {point.value!r} (entry point {point.name!r} of {source}) failed to import: {exc}"
                ) from exc
    except BaseException:
        _loaded_groups.discard(group)
        raise


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module and subpackage of ``package`` (call it as ``import_submodules(__name__,
    __path__)`` in a policy package's ``__init__.py``), so their registration decorators run."""
    for info in pkgutil.iter_modules(path, prefix=f"{package}."):
        import_module(info.name)


class Registry(Generic[T]):
    """Policies of one kind by name. ``group`` is the entry-point group of the packages to import on the
    first lookup (None: only what was registered explicitly, e.g. in a test)."""

    def __init__(self, kind: str, *, group: str | None = ENTRY_POINT_GROUP) -> None:
        self.kind = kind
        self._group = group
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: register ``factory`` (a class or a function returning the policy) as ``name``."""

        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories and self._factories[name] is not factory:
                raise ValueError(f"{self.kind} policy {name!r} is registered twice")
            self._factories[name] = factory
            return factory

        return decorator

    def _load(self) -> None:
        if self._group is not None:
            load_policy_packages(self._group)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._factories)

    def create(self, name: str, **options: Any) -> T:
        """Build the policy registered as ``name`` with keyword options (its config)."""
        self._load()
        try:
            factory = self._factories[name]
        except KeyError:
            raise UnknownPolicyError(self.kind, name, self.names(), group=self._group) from None
        return factory(**options)

    def check(self, name: str, options: Mapping[str, Any], *, label: str = "options") -> None:
        """Build ``name`` with ``options`` once and drop it, so configuration fails early with a
        ``ValueError`` that says what is wrong (the valid names, or the option the policy refused)."""
        try:
            self.create(name, **options)
        except UnknownPolicyError as exc:
            raise ValueError(str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.kind} policy {name!r} rejects {label} {dict(options)}: {exc}") from None


ADMISSION: Registry[AdmissionPolicy] = Registry("admission")
SCHEDULING: Registry[SchedulingPolicy] = Registry("scheduling")
PLACEMENT: Registry[PlacementPolicy] = Registry("placement")
VICTIM: Registry[VictimPolicy] = Registry("victim")
