"""A registry of named objects in registration order: the codecs (``output.codec``) and the
layouts (``source.layout``). Job-file checks, errors and docs list the names in that order.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class Registry(dict[str, T]):
    """name -> object, in registration order; ``noun`` names the objects in errors."""

    def __init__(self, noun: str):
        super().__init__()
        self.noun = noun

    def register(self, obj: T) -> T:
        """Add ``obj`` under its ``name`` (a second object of one name is a bug)."""
        name = getattr(obj, "name", "")
        if not name:
            raise ValueError(f"{type(obj).__name__} has no name")
        if self.get(name, obj) is not obj:
            raise ValueError(f"{self.noun} {name!r} is registered twice")
        self[name] = obj
        return obj

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self)

    def lookup(self, name: str) -> T:
        """The object called ``name``; ``ValueError`` listing the registered names otherwise."""
        try:
            return self[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.noun} {name!r} (registered: {', '.join(self)})") from None
