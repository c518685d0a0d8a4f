# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the settings sweep (plugins/module_utils/_sweep.py). Docs: plugins/filter/<name>.yml."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.inference.plugins.module_utils import _sweep


def sglang_sweep_combinations(matrix):
    try:
        return _sweep.combinations(matrix)
    except _sweep.SweepError as exc:
        raise AnsibleFilterError(str(exc)) from None


def sglang_sweep_restore(mode, best_row, combos, keys, original):
    try:
        return _sweep.restore_values(mode, best_row, combos, keys, original)
    except _sweep.SweepError as exc:
        raise AnsibleFilterError(str(exc)) from None


def sglang_sweep_observed(config):
    return _sweep.observed_text(config)


class FilterModule:
    """gpufleet.inference sweep filters."""

    def filters(self):
        return {
            "sglang_sweep_combinations": sglang_sweep_combinations,
            "sglang_sweep_restore": sglang_sweep_restore,
            "sglang_sweep_observed": sglang_sweep_observed,
        }
