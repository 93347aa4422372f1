"""`Registry`: names -> entries, for everything chosen by name in a config (architectures, mixers,
optimizers). Each entry is registered from its own module; every lookup of an unknown name is one error
listing the registered names and the closest ones (`did_you_mean`), so nothing ever falls through to a
default."""

from __future__ import annotations

import difflib
from typing import Any


def did_you_mean(name: str, choices) -> str:
    """ " (did you mean 'x'?)" naming the closest of `choices`, or "" when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=3)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str, entry: Any = None) -> Any:
        """`register(name, entry)`, or `@register(name)` on a function or class."""
        if entry is None:
            return lambda e: self.register(name, e)
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        self._entries.pop(name)

    def get(self, name: str) -> Any:
        if name not in self._entries:
            names = self.names()
            raise ValueError(
                f"unknown {self.kind} {name!r}; registered: {', '.join(names)}{did_you_mean(name, names)}"
            )
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def items(self):
        return self._entries.items()
