"""Grouping the backbone's layers into contiguous blocks 1..N."""

from __future__ import annotations

from ..errors import RetrofitConfigError


def partition_layers(n_layers: int, block_size: int = 4, boundaries: list[int] | None = None) -> list[range]:
    """Return the layer ranges of blocks 1..N (index 0 of the list is block 1).

    With `boundaries` (first layer of every block after the first) the split is
    explicit. Otherwise there are ceil(n_layers / block_size) blocks whose sizes differ
    by at most one, larger blocks first: 30 layers, size 4 -> 4,4,4,4,4,4,3,3.
    """
    if n_layers < 1:
        raise ValueError(f"a backbone needs at least one layer, got {n_layers}")
    if boundaries is not None:
        starts = [0, *boundaries]
        if starts != sorted(set(starts)) or starts[-1] >= n_layers:
            raise ValueError(
                f"boundaries {boundaries} must be strictly increasing and inside 1..{n_layers - 1}"
            )
        ends = [*boundaries, n_layers]
        return [range(s, e) for s, e in zip(starts, ends)]
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n_blocks = -(-n_layers // block_size)
    base, extra = divmod(n_layers, n_blocks)
    sizes = [base + 1] * extra + [base] * (n_blocks - extra)
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def retrofit_blocks(n_layers: int, block_size: int = 4, boundaries: list[int] | None = None) -> list[range]:
    """The blocks of a retrofit: `partition_layers`, refusing a partition with fewer than two blocks
    (block 1 has no router, so a single block would add nothing: no side-channel, nothing to skip)."""
    try:
        blocks = partition_layers(n_layers, block_size, boundaries)
    except ValueError as e:
        raise RetrofitConfigError(str(e)) from e
    if len(blocks) < 2:
        raise RetrofitConfigError(
            f"{n_layers} layers in blocks of {block_size} make {len(blocks)} block: a retrofit needs at least two "
            f"blocks (block 1 has no router); use a block size below {n_layers} or give boundaries"
        )
    return blocks


def inclusive_ranges(blocks: list[range]) -> list[list[int]]:
    """Blocks as [first, last] layer pairs (inclusive): the one convention of every file reskip writes."""
    return [[b.start, b.stop - 1] for b in blocks]
