"""Chat conversations kept whole in the update: the O(n log n) carrier grouping equals the previous one.

The previous :func:`~milegpo.policies.conversation.prefix_groups` (every row compared with the
carriers of its 16-token bucket) is kept here as the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from milegpo.policies.conversation import prefix_groups


def previous_prefix_groups(sequences: Sequence[Sequence[int]]) -> dict[int, list[int]]:
    """The grouping before: longest first, each row compared with the carriers of its bucket."""
    arrays = [np.asarray(s, dtype=np.int64) for s in sequences]
    order = sorted(range(len(arrays)), key=lambda i: -len(arrays[i]))
    buckets: dict[tuple[int, ...], list[int]] = {}
    groups: dict[int, list[int]] = {}
    for i in order:
        seq = arrays[i]
        key = tuple(seq[:16].tolist())
        for carrier in buckets.get(key, []):
            if np.array_equal(arrays[carrier][: len(seq)], seq):
                groups[carrier].append(i)
                break
        else:
            buckets.setdefault(key, []).append(i)
            groups[i] = [i]
    return groups


def random_conversations(rng: np.random.Generator) -> list[list[int]]:
    """Rows of a chat minibatch: turns of branching conversations sharing an opening, some cut short,
    some copies, some tiny vocabularies (many accidental prefixes), shuffled."""
    vocab = int(rng.choice([2, 3, 50]))
    opening = list(rng.integers(0, vocab, int(rng.choice([0, 4, 16, 20]))))
    rows: list[list[int]] = []
    for _ in range(int(rng.integers(1, 7))):
        seq = list(opening)
        for _ in range(int(rng.integers(1, 6))):
            seq = seq + list(rng.integers(0, vocab, int(rng.integers(1, 9))))
            rows.append(seq)
        if rng.random() < 0.3:
            rows.append(list(seq))  # a copy (the group's copies at their first step)
        if rng.random() < 0.3 and len(seq) > 2:
            rows.append(seq[: int(rng.integers(1, len(seq)))])  # a prefix that is no turn
    return [rows[i] for i in rng.permutation(len(rows))]


@pytest.mark.parametrize("seed", range(300))
def test_prefix_groups_equal_the_previous_grouping(seed):
    rows = random_conversations(np.random.default_rng(seed))
    got, want = prefix_groups(rows), previous_prefix_groups(rows)
    assert got == want
    assert list(got) == list(want)  # carriers in the same order too


def test_prefix_groups_of_nothing():
    assert prefix_groups([]) == {}
