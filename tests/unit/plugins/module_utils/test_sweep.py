# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_sweep (and its filters): combinations, the best row back to its combination, observed text."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.inference.plugins.filter import sweep as sweep_filter
from ansible_collections.gpufleet.inference.plugins.module_utils import _sweep

MATRIX = {"sglang_speculative_draft_window_size": [None, 1024], "sglang_speculative_num_draft_tokens": [8, 16]}
FILTERS = sweep_filter.FilterModule().filters()


def test_combinations_in_matrix_order_last_key_fastest():
    assert FILTERS["sglang_sweep_combinations"](MATRIX) == [
        {"sglang_speculative_draft_window_size": None, "sglang_speculative_num_draft_tokens": 8},
        {"sglang_speculative_draft_window_size": None, "sglang_speculative_num_draft_tokens": 16},
        {"sglang_speculative_draft_window_size": 1024, "sglang_speculative_num_draft_tokens": 8},
        {"sglang_speculative_draft_window_size": 1024, "sglang_speculative_num_draft_tokens": 16}]


@pytest.mark.parametrize("matrix,message", [
    (None, "must be a mapping"), ({}, "must be a mapping"), ({"window": [1]}, "start with sglang_"),
    ({"sglang_x": []}, "non-empty list"), ({"sglang_x": "1,2"}, "non-empty list"),
])
def test_bad_matrices(matrix, message):
    with pytest.raises(AnsibleFilterError, match=message):
        FILTERS["sglang_sweep_combinations"](matrix)


def test_best_row_maps_back_to_its_combination():
    combos = _sweep.combinations(MATRIX)
    keys = list(MATRIX)
    best = {"sglang_speculative_draft_window_size": "", "sglang_speculative_num_draft_tokens": "16"}
    assert _sweep.best_combination(best, combos, keys) == combos[1]
    assert _sweep.best_combination({"sglang_speculative_draft_window_size": "512",
                                    "sglang_speculative_num_draft_tokens": "16"}, combos, keys) is None
    assert _sweep.best_combination(None, combos, keys) is None


def test_restore_is_the_best_combination_or_the_original_values():
    combos = _sweep.combinations(MATRIX)
    keys = list(MATRIX)
    original = {"sglang_speculative_draft_window_size": 4096, "sglang_speculative_num_draft_tokens": 8}
    best = {"sglang_speculative_draft_window_size": "", "sglang_speculative_num_draft_tokens": "16"}
    restore = FILTERS["sglang_sweep_restore"]
    assert restore("best", best, combos, keys, original) == combos[1]
    assert restore("original", best, combos, keys, original) == original
    assert restore("best", None, combos, keys, original) == original  # nothing measured
    assert restore("best", {"sglang_speculative_draft_window_size": "512",
                            "sglang_speculative_num_draft_tokens": "16"}, combos, keys, original) == original
    with pytest.raises(AnsibleFilterError, match="sweep_restore must be original or best"):
        restore("none", best, combos, keys, original)


def test_observed_text():
    config = {"attention_backend": "fa3", "model": "M", "block_size": 16, "draft_window_size": None,
              "compact_cache": False}
    assert FILTERS["sglang_sweep_observed"](config) == "block_size=16 draft_window_size=None compact_cache=False"
    assert FILTERS["sglang_sweep_observed"](None) == ""
