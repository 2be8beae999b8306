"""Reply loops: a reply that repeats itself verbatim, as a small model does when it falls into a cycle ("the fury of
the fury of the fury...", a line written ten times).

A reply loops when some span of it is one unit of 1 to `MAX_UNIT` tokens written at least `MIN_REPEATS` times in a
row, covering at least `MIN_TOKENS` tokens. Token ids, not text: exact and cheap (O(length x MAX_UNIT)). A list whose
items differ is not a loop; a unit repeated twice is not one either ("very, very"), nor three short repeats under
`MIN_TOKENS` ("ha ha ha")."""

from __future__ import annotations

MAX_UNIT, MIN_REPEATS, MIN_TOKENS = 32, 3, 12


def loop_span(ids: list[int]) -> tuple[int, int, int] | None:
    """(start, unit length, repeats) of the first loop in `ids`, or None."""
    n = len(ids)
    for unit in range(1, min(MAX_UNIT, n // MIN_REPEATS) + 1):
        run = 0  # positions i (>= unit) so far in a row with ids[i] == ids[i - unit]
        for i in range(unit, n):
            run = run + 1 if ids[i] == ids[i - unit] else 0
            covered = run + unit  # the span is the first unit and `run` tokens repeating it
            if covered >= max(MIN_TOKENS, MIN_REPEATS * unit):
                start = i + 1 - covered
                return start, unit, covered // unit
    return None


def loops(ids: list[int]) -> bool:
    return loop_span(ids) is not None
