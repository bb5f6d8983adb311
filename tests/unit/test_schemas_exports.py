"""The public API of ``schemas`` is exactly its ``__all__`` (after httpx's test_exported_members)."""

from __future__ import annotations

import schemas
from schemas.base import WireModel
from schemas.subjects import SUBJECTS


def test_all_names_are_exported() -> None:
    exported = set(dir(schemas))
    missing = [name for name in schemas.__all__ if name not in exported]
    assert not missing
    assert len(schemas.__all__) == len(set(schemas.__all__)), "duplicate names in __all__"


def test_every_public_model_is_in_all() -> None:
    public = {
        name
        for name, value in vars(schemas).items()
        if not name.startswith("_") and isinstance(value, type) and issubclass(value, WireModel)
    }
    assert public <= set(schemas.__all__)


def test_every_subject_model_is_exported() -> None:
    for spec in SUBJECTS:
        assert getattr(schemas, spec.model.__name__) is spec.model
        if spec.reply_model is not None:
            assert getattr(schemas, spec.reply_model.__name__) is spec.reply_model


def test_all_is_sorted_for_review() -> None:
    # Upper-case constants first, then classes, then functions: the order ruff's RUF022 keeps.
    assert schemas.__all__ == sorted(schemas.__all__, key=lambda n: (not n.isupper(), not n[0].isupper(), n))
