# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What counts as evidence that a process runs the intended settings, and the verdicts it allows.

Private to this collection: no compatibility promise. Pure except for the receipt file I/O.

Only what the running process says about itself counts: its config line(s) in the journal of its
own invocation, or a receipt written when that same invocation was verified. /server_info echoes
the parsed arguments and proves nothing about the runtime. Without evidence the verdict is
``unverified``, never ``pass``.

Which config line counts: ALL of them. A process that logs the config line twice (a draft worker
re-initialised, e.g. after an error) ran with each setting for a while; every rank-0 line of the
invocation must agree with the intent, and one that does not is a mismatch naming which line.
Taking only the last one would pass a process whose first worker ran other settings; taking only
the first would miss a re-initialisation into other settings.
"""
from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.inference.plugins.module_utils._files import write_json
from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg

REQUIRED = "required"   # a config line must be logged and agree
ABSENT = "absent"       # no draft-runner line may be logged (speculative decoding off)
OPTIONAL = "optional"   # compare lines if any; none is fine
CONFIG_LINE_MODES = (REQUIRED, ABSENT, OPTIONAL)

# Outcomes of judging an invocation without a config line.
CONCLUSIVE = "conclusive"    # the journal kept the place where the line belongs: it was not logged
LOST = "lost"                # journald dropped lines of the invocation (rate limit)
NO_START = "no_start"        # the invocation's first line is gone (retention) or never came
INCOMPLETE = "incomplete"    # nothing logged after the line's place yet: cannot tell

RECEIPT_VERSION = 1


def config_line_mode(mode, expect):
    """The effective mode: an explicit one, else required when values are expected, else optional."""
    if mode:
        return mode
    return REQUIRED if expect else OPTIONAL


def environment_text(environment):
    """NAME -> value as systemd sets it: text (None -> '', booleans -> 1/0, as the role renders)."""
    out = {}
    for key, value in (environment or {}).items():
        if value is None:
            value = ""
        elif isinstance(value, bool):
            value = "1" if value else "0"
        out[str(key)] = str(value)
    return out


class Intent(object):
    """What the process must run: config-line values (and whether a line may appear at all),
    its command line, and its environment (each optional). ``follower``: the unit runs a follower node
    of a multi-node serving group, which serves no HTTP: its own journal says when it joined the group."""

    def __init__(self, expect=None, config_line=None, command=None, environment=None, follower=False):
        self.expect = cfg.normalize_expect(expect)
        self.mode = config_line_mode(config_line, self.expect)
        self.command = list(command) if command else None
        self.environment = environment_text(environment) if environment is not None else None
        self.follower = bool(follower)


def judged_lines(receipt, journal_lines):
    """Every config line to judge: those the receipt kept (for a start the journal may no longer
    hold), then those read from the journal that the receipt does not hold already - a receipt
    stands in only for lines the journal no longer has and never hides a later one."""
    kept = list(receipt.get("config_lines") or []) if receipt else []
    cursors = set(line.get("cursor") for line in kept)
    return kept + [line for line in journal_lines if line.get("cursor") not in cursors]


def evidence_source(receipt, journal_lines):
    """Where the config-line evidence comes from: journal, receipt, receipt+journal."""
    if receipt is None:
        return "journal"
    return "receipt+journal" if journal_lines else "receipt"


def mismatches(expect, mode, lines):
    """Mismatches of every config line against the intent: list of {key, expected, observed, line}.

    With mode ABSENT any draft-runner line is a mismatch (key ``draft_runner``).
    """
    found = []
    if mode == ABSENT:
        for index, line in enumerate(lines):
            found.append({"key": "draft_runner", "expected": "no draft-runner line (speculative decoding off)",
                          "observed": line.get("line"), "occurrence": index + 1})
        return found
    for index, line in enumerate(lines):
        for item in cfg.compare(expect, line["values"]):
            item["occurrence"] = index + 1
            item["line"] = line.get("line")
            found.append(item)
    return found


def journal_completeness(start_seen, after_config_seen, notices):
    """Why an invocation's journal may lack its config line: CONCLUSIVE, LOST, NO_START or INCOMPLETE.

    journald writes its "Suppressed N messages" notice right before the first message it accepts
    again, so once a line logged after the config line's place is in the journal, any loss in
    between has left its notice already.
    """
    if notices:
        return LOST
    if not start_seen:
        return NO_START
    if not after_config_seen:
        return INCOMPLETE
    return CONCLUSIVE


# ------------------------------------------------------------------------------ receipts

def receipt_path(directory, unit):
    return os.path.join(directory, "%s.json" % unit)


def compared_anything(mode, expect, lines):
    """Whether a verification compared the config line at all: "off" was checked (ABSENT), or lines
    were compared with expected values. A readiness-only check compared nothing and leaves no receipt:
    a receipt records only what was compared."""
    return mode == ABSENT or bool(expect and lines) or (mode == REQUIRED and bool(lines))


def make_receipt(unit, invocation_id, main_pid, expect, mode, config_lines, command, verified_at, journal_cursor=None):
    """What a verification saw, kept on the host for checks after the journal lost the start.

    ``journal_cursor``: how far the verification read the invocation's journal; later checks read
    on from there, so a line logged after the verification is judged too (never hidden by the receipt).
    """
    return {
        "version": RECEIPT_VERSION,
        "unit": unit,
        "invocation_id": invocation_id,
        "main_pid": main_pid,
        "verified_at": verified_at,
        "expect": cfg.normalize_expect(expect),
        "config_line_mode": mode,
        "config_lines": [{"line": line.get("line"), "values": line.get("values"),
                          "cursor": line.get("cursor"), "realtime_usec": line.get("realtime_usec")}
                         for line in config_lines],
        "journal_cursor": journal_cursor or (config_lines[-1].get("cursor") if config_lines else None),
        "command": command,
    }


def receipt_cursor(receipt):
    """Where a later check reads the invocation's journal on from: the receipt's read position (older
    receipts: their last config line), None to search from the start."""
    lines = receipt.get("config_lines") or []
    return receipt.get("journal_cursor") or (lines[-1].get("cursor") if lines else None)


def trusted_file(path, uid=None):
    """Whether only root or the user this check runs as could have written `path`: owned by one of
    them and not writable by group or others."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return info.st_uid in (0, os.geteuid() if uid is None else uid) and not info.st_mode & 0o022


def read_receipt(path):
    """The receipt at `path`, or None when there is none, it is unreadable, or someone other than the
    user who writes receipts could have written it (a receipt is evidence)."""
    if not trusted_file(path):
        return None
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != RECEIPT_VERSION:
        return None
    return data


def receipt_of(receipt, unit, invocation_id):
    """The receipt if it was written for this very invocation of this unit and records a comparison,
    else None. A receipt of a readiness-only check (mode optional, no line) proves nothing about the
    config line; earlier releases wrote such receipts."""
    if not (receipt and invocation_id and receipt.get("unit") == unit and receipt.get("invocation_id") == invocation_id):
        return None
    if receipt.get("config_line_mode") not in (REQUIRED, ABSENT) and not receipt.get("config_lines"):
        return None
    return receipt


def write_receipt(path, receipt):
    """Atomically (temp file + rename), mode 0644: a receipt holds no secret."""
    write_json(path, receipt)
