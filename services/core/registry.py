"""One name registry per policy kind. Services and the simulator pick policies by these names.

Policies register with a decorator in their own module; the registry imports the policy packages
lazily on the first lookup, so ``services.core`` does not import the services that host policies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any, Generic, TypeVar

from services.core.protocols import AdmissionPolicy, PlacementPolicy, SchedulingPolicy, VictimPolicy

T = TypeVar("T")


class UnknownPolicyError(LookupError):
    """A policy name that is not registered; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: list[str]) -> None:
        super().__init__(f"unknown {kind} policy {name!r}; valid: {', '.join(valid) or '(none)'}")
        self.kind = kind
        self.name = name
        self.valid = valid


class Registry(Generic[T]):
    def __init__(self, kind: str, plugin_packages: tuple[str, ...]) -> None:
        self.kind = kind
        self._plugin_packages = plugin_packages
        self._factories: dict[str, Callable[..., T]] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories and self._factories[name] is not factory:
                raise ValueError(f"{self.kind} policy {name!r} is registered twice")
            self._factories[name] = factory
            return factory

        return decorator

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for package in self._plugin_packages:
                import_module(package)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._factories)

    def create(self, name: str, **options: Any) -> T:
        """Build the policy registered as ``name`` with keyword options (its config)."""
        self._load()
        try:
            factory = self._factories[name]
        except KeyError:
            raise UnknownPolicyError(self.kind, name, self.names()) from None
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



ADMISSION: Registry[AdmissionPolicy] = Registry("admission", ("services.admission.policies",))
SCHEDULING: Registry[SchedulingPolicy] = Registry("scheduling", ("services.scheduler.policies",))
PLACEMENT: Registry[PlacementPolicy] = Registry("placement", ("services.placement.policies",))
VICTIM: Registry[VictimPolicy] = Registry("victim", ("services.placement.policies",))
