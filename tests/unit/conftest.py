# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared fixtures of the unit tests; the fakes themselves live in tests/unit/fakes.py
(importable as `fakes` from every test file below this directory)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def run_table():
    import fakes
    return fakes.RunTable()


@pytest.fixture
def jentries():
    import fakes
    return fakes.make_entries
