"""Dense integer ids and sort-based uniques of 1-D numpy arrays, the numbering that the credit
methods and the graph build share; each one gives what ``numpy.unique`` (or a dictionary) would,
faster on the batches credit sees."""

from __future__ import annotations

import collections

import numpy as np


def index_strings(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Map strings to dense integer ids (one id space over all arrays), numbered in order of first
    appearance (the arrays read one after the other).

    One dict lookup per string, all of it in C: a ``defaultdict`` whose missing keys get the dict's
    current size, read through ``map``. Measured against ``numpy.unique`` of the strings' hashes (with
    a check for collisions) and against a Python loop of ``setdefault``, it is as fast on distinct keys
    and faster on repeated ones (1M rows)."""
    ids: collections.defaultdict[object, int] = collections.defaultdict()
    ids.default_factory = ids.__len__
    return tuple(np.fromiter(map(ids.__getitem__, a), dtype=np.int64, count=len(a)) for a in arrays)


def dense_ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.unique(values, return_inverse=True)`` of a 1-D integer array (the inverse as int64).

    Ids within a span of a few times the array's length (task ids, trajectory ids) are looked up in a
    table of the span, with no sort; wider ones are sorted by ``numpy.unique``."""
    values = np.asarray(values)
    if len(values) == 0 or values.dtype.kind not in "iu":
        unique, inverse = np.unique(values, return_inverse=True)
        return unique, inverse.astype(np.int64).reshape(-1)
    low = int(values.min())
    span = int(values.max()) - low + 1
    if span > 4 * len(values) + 1024:
        unique, inverse = np.unique(values, return_inverse=True)
        return unique, inverse.astype(np.int64).reshape(-1)
    offset = (values - low).astype(np.int64)
    present = np.zeros(span, dtype=bool)
    present[offset] = True
    rank = np.cumsum(present, dtype=np.int64) - 1
    return (np.flatnonzero(present) + low).astype(values.dtype), rank[offset]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``numpy.unique(values)`` of a 1-D array, by one sort: numpy 2.3's ``unique`` without options
    hashes instead, about 60x slower on 2M distinct integers (1.9 s against 0.03 s). The sort is
    numpy's default (vectorised where the CPU has it: 1M int64 in 7 ms against 65 ms stable); equal
    values are dropped, so its instability cannot show."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``numpy.unique(values, return_inverse=True, return_counts=True)`` of a 1-D integer array (the
    inverse as int64), by one default-kind argsort."""
    order = np.argsort(values)
    ordered = values[order]
    new = np.r_[True, ordered[1:] != ordered[:-1]] if len(ordered) else np.zeros(0, dtype=bool)
    inverse = np.empty(len(values), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    return ordered[starts], inverse, np.diff(np.r_[starts, len(values)])


def segment_starts(sorted_ids: np.ndarray) -> np.ndarray:
    """Start index of every run of equal values in a sorted array."""
    if len(sorted_ids) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])

