# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's output parsers, table-driven (the scripts themselves run in
tests/functional/test_preflight_scripts.py against the simulator)."""
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._preflight import (
    MARKER, REDACTED, parse_check_output, parse_version_output)

KEY = "s3cr3t-KEY.value"


def report(**fields):
    data = {"ok": False, "stage": "resolve", "error": None, "exception": None,
            "checked": ["import sglang 0.5.23"], "unchecked": ["ports"]}
    data.update(fields)
    return "%s_STAGE import\nnoise\n%s %s\n" % (MARKER, MARKER, json.dumps(data))


CHECK_TABLE = [
    # id, rc, out, err, expected subset
    ("pass", 0, report(ok=True, checked=["a", "b"]), "", {"ok": True, "stage": "resolve", "error": None,
                                                          "checked": ["a", "b"], "unchecked": ["ports"]}),
    ("argparse", 1, report(stage="parse", error="sglang serve: error: unrecognized arguments: --bogus 1",
                           exception="SystemExit"), "usage: ...",
     {"ok": False, "stage": "parse", "error": "sglang serve: error: unrecognized arguments: --bogus 1",
      "exception": "SystemExit"}),
    ("value error", 1, report(error="--speculative-draft-window-size must be positive, got 0.",
                              exception="ValueError"), "",
     {"ok": False, "stage": "resolve", "error": "--speculative-draft-window-size must be positive, got 0."}),
    ("no sglang", 1, report(stage="import", error="No module named 'sglang'", exception="ModuleNotFoundError"), "",
     {"ok": False, "stage": "import", "error": "No module named 'sglang'"}),
    ("ok but nonzero exit", 3, report(ok=True), "",
     {"ok": False, "error": "preflight reported success but exited 3"}),
    ("crash after parse", 1, "%s_STAGE import\n%s_STAGE parse\n" % (MARKER, MARKER),
     "Traceback (most recent call last):\n  ...\nMemoryError: out of memory\n",
     {"ok": False, "stage": "parse", "error": "MemoryError: out of memory (exit 1)", "checked": []}),
    ("killed", -9, "%s_STAGE resolve\n" % MARKER, "",
     {"ok": False, "stage": "resolve", "error": "no answer (killed by signal 9)"}),
    ("no python", 127, "", "/bin/sh: /opt/sglang/venv/bin/python: not found",
     {"ok": False, "stage": "import", "error": "/bin/sh: /opt/sglang/venv/bin/python: not found (exit 127)"}),
    ("garbled report", 1, "%s {not json\n" % MARKER, "",
     {"ok": False, "stage": "import", "error": "no answer (exit 1)"}),
    ("key in a crash", 1, "", "ValueError: bad ServerArgs(api_key='%s', port=1)" % KEY,
     {"ok": False, "error": "ValueError: bad ServerArgs(api_key=%s, port=1) (exit 1)" % REDACTED}),
    ("key in a report", 1, report(error="server_args={'api_key': '%s'}" % KEY),
     "", {"ok": False, "error": "server_args={'api_key': %s}" % REDACTED}),
]


@pytest.mark.parametrize("rc, out, err, expected", [row[1:] for row in CHECK_TABLE],
                         ids=[row[0] for row in CHECK_TABLE])
def test_parse_check_output(rc, out, err, expected):
    result = parse_check_output(rc, out, err)
    assert set(result) == {"ok", "stage", "error", "exception", "checked", "unchecked"}
    assert {k: result[k] for k in expected} == expected
    assert KEY not in json.dumps(result)


def vreport(**fields):
    return "%s %s\n" % (MARKER, json.dumps(fields))


VERSION_TABLE = [
    ("metadata", 0, vreport(version="0.5.23", source="metadata", error=None), "",
     {"version": "0.5.23", "source": "metadata", "error": None}),
    ("import", 0, vreport(version="0.5.11", source="import", error="no package metadata for sglang; ..."),
     "", {"version": "0.5.11", "source": "import", "error": "no package metadata for sglang; ..."}),
    ("none", 1, vreport(version=None, source=None, error="ModuleNotFoundError: No module named 'sglang'"),
     "", {"version": None, "source": None, "error": "ModuleNotFoundError: No module named 'sglang'"}),
    ("no python", 127, "", "env: 'python': No such file or directory",
     {"version": None, "source": None, "error": "env: 'python': No such file or directory (exit 127)"}),
    ("killed", -15, "", "", {"version": None, "source": None, "error": "no answer (killed by signal 15)"}),
    ("odd source", 0, vreport(version="0.5.23", source="guess", error=None), "",
     {"version": "0.5.23", "source": None, "error": None}),
]


@pytest.mark.parametrize("rc, out, err, expected", [row[1:] for row in VERSION_TABLE],
                         ids=[row[0] for row in VERSION_TABLE])
def test_parse_version_output(rc, out, err, expected):
    assert parse_version_output(rc, out, err) == expected
