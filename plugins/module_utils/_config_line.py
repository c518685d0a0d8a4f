# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse SGLang's startup config lines and compare them with intended settings.

Pure functions, private to this collection: no compatibility promise.

SGLang logs, once from TP rank 0, e.g.::

    [2026-11-29 10:00:00 TP0] Initialized DFLASH draft runner. attention_backend=flashinfer,
        model=DFlashDraftModel, block_size=16, draft_window_size=2048, compact_cache=True

A line is recognised by SGLang's logging SHAPE, never by a substring: the logging prefix
``[YYYY-MM-DD HH:MM:SS(.mmm)( TAGn)*]`` (rank tags only for dimensions > 1) with the message right
after it. With ``--log-requests`` SGLang logs each request's text (``Receive: obj=...``), so a user
prompt that quotes a config line must not become one: its marker is not at the message's start.
Request text is logged through ``repr``/JSON, so it can never begin a journal line of its own.
Deployments wrap lines (docker ``--timestamps``, Ray's ``(Actor pid=N) ... [repeated 7x across
cluster]``) and class names vary: those wrappers are accepted in front of the prefix, and only the
``key=value`` pairs after the marker are read.
"""
from __future__ import annotations

import re

# What journalctl --grep looks for (PCRE2); MARKERS below must stay in sync.
GREP_PATTERN = r"Initialized (DFLASH draft runner|DDTree worker)\."

MARKERS = {
    "Initialized DFLASH draft runner.": "dflash",
    "Initialized DDTree worker.": "ddtree",
}

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# What deployments put in front of SGLang's own line: docker's RFC 3339 stamp, Ray's actor tag.
_WRAPPER = r"(?:\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})\s+)?" \
           r"(?:\((?:[\w.]+\s+)?pid=\d+(?:,\s*ip=[\w.:]+)?\)\s+)?"
# SGLang's logging prefix "[YYYY-MM-DD HH:MM:SS(.mmm)( TAGn)*] " and the message right after it.
_LINE_RE = re.compile(
    r"^" + _WRAPPER + r"\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?)"
    r"(?P<tags>(?:\s+(?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\]\s(?P<message>.*)$", re.DOTALL)
_MARKER_RE = re.compile(r"Initialized (?:DFLASH draft runner|DDTree worker)\.")
# SGLang's rank tags (each only when that dimension is > 1), in the order it prints them.
RANK_TAGS = ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")
_TAG_RE = re.compile(r"(?<![A-Z_])(DP|PP|ATTN_CP|MOE_DP|TP|EP)(\d+)")
_REPEATED_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_PAIR_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*?)(?=,\s*[A-Za-z_][A-Za-z0-9_]*=|$)")

ABSENT = "<absent>"


def parse_value(text):
    """Turn one logged value (Python's %s of it) into None, bool, int, float or str."""
    value = text.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if value == "None":
        return None
    if value == "True":
        return True
    if value == "False":
        return False
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def split_line(line):
    """(timestamp, tags, message) of a line in SGLang's logging shape, else None.

    ``tags`` maps rank tags to numbers (e.g. {"DP": 1, "TP": 0}); wrappers (docker, Ray) in front
    of the prefix are dropped, as are colour codes.
    """
    if not line:
        return None
    match = _LINE_RE.match(_ANSI_RE.sub("", line).strip("\r\n"))
    if not match:
        return None
    tags = dict((name, int(number)) for name, number in _TAG_RE.findall(match.group("tags")))
    return match.group("ts"), tags, match.group("message")


_BARE_RE = re.compile(r"^" + _WRAPPER + r"(?P<message>.*)$", re.DOTALL)


def message_of(line):
    """(prefixed, tags, message): the message of a line in SGLang's shape (prefixed True), else the
    line itself without wrappers and colour codes (uvicorn's and tqdm's lines carry no prefix in
    some setups)."""
    parts = split_line(line)
    if parts is not None:
        return True, parts[1], parts[2]
    clean = _ANSI_RE.sub("", line or "").strip("\r\n")
    return False, {}, _BARE_RE.match(clean).group("message")


def parse_config_line(line):
    """Parse one log line; None unless it is a config line (SGLang's prefix, the marker right after it).

    Returns a dict: ``kind`` (dflash|ddtree), ``values`` (key -> parsed value), ``tags``
    (rank tags, e.g. {"DP": 1, "TP": 0}), ``timestamp`` (str), ``rank0`` (bool) and
    ``line`` (the line without colour codes).
    """
    parts = split_line(line)
    if parts is None:
        return None
    timestamp, tags, message = parts
    match = _MARKER_RE.match(message)
    if not match:
        return None
    kind = MARKERS[match.group(0)]
    body = _REPEATED_RE.sub("", message[match.end():]).strip()
    values = {}
    for key, raw in _PAIR_RE.findall(body):
        values[key] = parse_value(raw)
    if not values:
        return None
    return {
        "kind": kind,
        "values": values,
        "tags": tags,
        "timestamp": timestamp,
        "rank0": tags.get("TP", 0) == 0,
        "line": _ANSI_RE.sub("", line).rstrip("\r\n"),
    }


def find_config_lines(lines):
    """Every rank-0 config line among `lines`, parsed, in order (a re-initialised worker logs twice)."""
    found = []
    for line in lines:
        parsed = parse_config_line(line)
        if parsed and parsed["rank0"]:
            found.append(parsed)
    return found


def find_config_line(lines):
    """The first rank-0 config line among `lines` (parsed), or None."""
    found = find_config_lines(lines)
    return found[0] if found else None


def normalize(value):
    """Coerce a value that may have passed through Jinja (strings) to None/bool/int/float/str."""
    if isinstance(value, str):
        text = value.strip()
        lowered = text.lower()
        if lowered in ("none", "null", "~", ""):
            return None
        if lowered in ("true", "yes", "on"):
            return True
        if lowered in ("false", "no", "off"):
            return False
        parsed = parse_value(text)
        return parsed
    return value


def values_equal(expected, observed):
    """Compare after coercion: "2048" == 2048, "None" == None, "true" == True; never True == 1."""
    left = normalize(expected)
    right = normalize(observed)
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return float(left) == float(right)
    return str(left) == str(right)


def compare(expected, observed):
    """Every expected key against `observed` (a dict). Returns a list of mismatches.

    Each mismatch is a dict ``key``, ``expected``, ``observed`` (ABSENT when the key is missing).
    """
    mismatches = []
    for key in sorted(expected or {}):
        want = expected[key]
        if key not in observed:
            mismatches.append({"key": key, "expected": normalize(want), "observed": ABSENT})
        elif not values_equal(want, observed[key]):
            mismatches.append({"key": key, "expected": normalize(want), "observed": observed[key]})
    return mismatches


def normalize_expect(expected):
    """The expected dict with values coerced (what the module reports as `expected`)."""
    return dict((key, normalize(value)) for key, value in (expected or {}).items())


def render(value):
    """How a value reads in a message: like the log prints it (None, True, 2048)."""
    if value is ABSENT:
        return "nothing (key not logged)"
    return repr(value) if isinstance(value, str) else str(value)
