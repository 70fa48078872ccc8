"""Selecting samples by their marks (Python's continuation marks, see ``sampler.marks``).

A sample's mark set is a tuple of extents, innermost first, each holding one value
per custom key (``None`` where that extent set another key).  The value of a key for
a sample is the one set by the innermost extent that carries it -- what
``current_marks(key)[0]`` returned in the program at that moment.

Predicates are evaluated once per *distinct* mark set, never per sample.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence, Union

MISSING: Any = object()
"""Returned by :func:`value_of` when no extent of a mark set carries the key."""

MarkFilter = Union[Mapping[Any, Any], Callable[["Marks"], bool]]


class Marks(Mapping):
    """One sample's marks, read-only: ``marks[key]`` is the innermost value of ``key``.

    ``extents`` is the raw mark set (innermost first, one tuple of values per custom
    key), and :meth:`all` gives every value of a key, innermost first, for filters
    that care about nesting (say, "inside any request of user 7").
    """

    __slots__ = ("extents", "_keys")

    def __init__(self, extents: Sequence[tuple], custom_keys: Sequence[Any]) -> None:
        self.extents = tuple(extents)
        self._keys = tuple(custom_keys)

    def all(self, key: Any) -> list[Any]:
        """Every value ``key`` has in this mark set, innermost first."""
        pos = self._keys.index(key) if key in self._keys else None
        if pos is None:
            return []
        return [e[pos] for e in self.extents if e[pos] is not None]

    def __getitem__(self, key: Any) -> Any:
        values = self.all(key)
        if not values:
            raise KeyError(key)
        return values[0]

    def __iter__(self) -> Iterator[Any]:
        return (k for k in self._keys if self.all(k))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"Marks({dict(self)!r})"


def key_position(key: Any, custom_keys: Sequence[Any]) -> int:
    """Where ``key``'s values sit in each extent; a clear error for an unknown key."""
    try:
        return list(custom_keys).index(key)
    except ValueError:
        known = ", ".join(map(repr, custom_keys)) or "none (the sampler was given no custom_keys)"
        raise ValueError(f"unknown mark key {key!r}; the snapshots carry keys: {known}") from None


def value_of(mark_set: Sequence[tuple], pos: int) -> Any:
    """The innermost value at ``pos`` in ``mark_set``, or :data:`MISSING`."""
    for extent in mark_set:
        v = extent[pos]
        if v is not None:
            return v
    return MISSING


def mark_set_filter(marks: MarkFilter, mark_sets: Sequence[tuple],
                    custom_keys: Sequence[Any]) -> list[bool]:
    """For each mark set id, whether its samples are kept.

    ``marks`` is a ``{key: value}`` mapping (every key's innermost value must equal the
    given value) or a callable taking a :class:`Marks` and returning a truth value.
    """
    if isinstance(marks, Mapping):
        wanted = [(key_position(k, custom_keys), v) for k, v in marks.items()]
        return [all(value_of(ms, pos) == v for pos, v in wanted) for ms in mark_sets]
    if callable(marks):
        return [bool(marks(Marks(ms, custom_keys))) for ms in mark_sets]
    raise TypeError(f"marks= takes a {{key: value}} mapping or a callable on Marks, "
                    f"not {type(marks).__name__}")
