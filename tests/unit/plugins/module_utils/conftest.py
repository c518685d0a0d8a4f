# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""run_command fakes, community.general style: a table of argv -> (rc, out, err)."""
import json

import pytest


class RunTable(object):
    """Answers argv from a table (exact tuples); records every call; unknown argv fails the test."""

    def __init__(self, table=None):
        self.table = dict((tuple(argv), result) for argv, result in (table or {}).items())
        self.calls = []

    def add(self, argv, rc=0, out="", err=""):
        self.table[tuple(argv)] = (rc, out, err)

    def __call__(self, argv):
        self.calls.append(list(argv))
        try:
            result = self.table[tuple(argv)]
        except KeyError:
            raise AssertionError("unexpected command: %r" % (argv,))
        return result(argv) if callable(result) else result


def make_entries(*entries):
    """journalctl -o json output from (message, cursor[, extra fields]) tuples."""
    lines = []
    for index, item in enumerate(entries):
        message, cursor = item[0], item[1]
        fields = {"MESSAGE": message, "__CURSOR": cursor, "__REALTIME_TIMESTAMP": str(1764410400000000 + index),
                  "_PID": "4242"}
        if len(item) > 2:
            fields.update(item[2])
        lines.append(json.dumps(fields))
    return "\n".join(lines) + ("\n" if lines else "")


@pytest.fixture
def run_table():
    return RunTable()


@pytest.fixture
def jentries():
    return make_entries
