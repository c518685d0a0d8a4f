# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side helper of the action plugins: build module payloads without the garbage collector.

An action runs in a worker forked from ansible-playbook, which inherits the whole main process's heap.
Building a module payload parses every module_util it sends (hundreds of thousands of AST nodes), which
triggers full collections, and each one walks the inherited heap (touching its pages, so the fork copies
them): measured, the three critical-path payloads cost a rollout's worker 0.7 s with the collector on and
0.5 s with it paused (tests/benchmarks/RESULTS.md, run 9). Nothing built there holds reference cycles
that need collecting, and the worker ends with its task.

Private to this collection: no compatibility promise.
"""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collector_paused():
    """Pause the garbage collector for the block (it was on: it is on again after, whatever happens)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
