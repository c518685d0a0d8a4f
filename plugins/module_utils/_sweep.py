# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan of a settings sweep: combinations, what to restore, how a measured row reads.

Private to this collection: no compatibility promise. Pure; exposed as filters (plugins/filter/sweep.py).
"""
from __future__ import annotations

import itertools

from ansible_collections.gpufleet.inference.plugins.module_utils._report import cell


class SweepError(ValueError):
    pass


def check_matrix(matrix):
    """sweep_matrix: a mapping of role variable (sglang_*) to a non-empty list of values."""
    if not isinstance(matrix, dict) or not matrix:
        raise SweepError("sweep_matrix must be a mapping of role variable to a list of values, got %r" % (matrix,))
    for key, values in matrix.items():
        if not isinstance(key, str) or not key.startswith("sglang_"):
            raise SweepError("sweep_matrix key %r is not a variable of the role gpufleet.inference.sglang "
                             "(they start with sglang_)" % (key,))
        if not isinstance(values, list) or not values:
            raise SweepError("sweep_matrix[%r] must be a non-empty list of values, got %r" % (key, values))
    return True


def combinations(matrix):
    """Every combination, in the matrix's order (the last key varies fastest)."""
    check_matrix(matrix)
    keys = list(matrix)
    return [dict(zip(keys, values)) for values in itertools.product(*(matrix[key] for key in keys))]


def best_combination(best_row, combos, keys):
    """The combination a best CSV row (text cells, '' for null) was measured for, or None."""
    if not best_row:
        return None
    for combo in combos:
        if all(cell(combo.get(key)) == (best_row.get(key) or "") for key in keys):
            return combo
    return None


def restore_values(mode, best_row, combos, keys, original):
    """What a sweep's end restores: with mode 'best' the best measured combination (the original
    values when no combination was measured), with 'original' the original values."""
    if mode not in ("original", "best"):
        raise SweepError("sweep_restore must be original or best to restore values, got %r" % (mode,))
    best = best_combination(best_row, combos, keys) if mode == "best" else None
    return best if best is not None else original


def observed_text(config):
    """A config line's settings as one cell: 'block_size=16 draft_window_size=None compact_cache=False'."""
    return " ".join("%s=%s" % (key, "None" if value is None else value)
                    for key, value in (config or {}).items() if key not in ("attention_backend", "model"))
