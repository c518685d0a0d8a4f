# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wording of every verdict: what was being done, what was seen, what it means.

Private to this collection: no compatibility promise. Pure functions of plain values.
"""
from __future__ import annotations

import re

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils._process import redact_text

# Lines that name why a process failed, most telling first (argparse, Python, SGLang, CUDA).
_CAUSE = re.compile(r"error: |Error\b|Exception|exception:|unrecognized arguments|out of memory|"
                    r"Received sigquit|Killed|Traceback", re.IGNORECASE)
_NOT_A_CAUSE = re.compile(r"^\s*Traceback \(most recent call last\)|^\s*File \"|^\s*warnings\.warn")


def likely_cause(lines):
    """The line that most likely says why the process failed (the last error-like line), or None."""
    for line in reversed(list(lines or [])):
        if _CAUSE.search(line) and not _NOT_A_CAUSE.search(line):
            return line.strip()
    return None


def _ordinal(number):
    return {1: "first", 2: "second", 3: "third"}.get(number, "#%s" % number)


def mismatch_message(unit, invocation_id, items, flag_in_unit):
    """`items` from _evidence.mismatches (config line) or _process.compare_* (command, environment)."""
    parts = []
    for item in items:
        where = item.get("where")
        if where is None:
            count = item.get("occurrence")
            where = "in the %s config line of invocation %s" % (_ordinal(count), invocation_id) if count and count > 1 \
                else "in the config line of invocation %s" % invocation_id
        if item["key"] == "draft_runner":
            parts.append("expected %s, but it logged %r %s" % (item["expected"], item["observed"], where))
            continue
        if item.get("plain"):  # command line / environment: text as given, absent = nothing
            parts.append("%s: expected %s, observed %s %s" % (
                item["key"], _text(item["expected"]), _text(item["observed"]), where))
            continue
        flag = flag_in_unit(item["key"]) if flag_in_unit else None
        parts.append("%s: expected %s%s, observed %s %s" % (
            item["key"], cfg.render(item["expected"]), " (%s)" % flag if flag else "",
            cfg.render(item["observed"]), where))
    return "%s runs other settings than intended: %s" % (unit, "; ".join(parts))


def _text(value):
    if value is None:
        return "nothing"
    if isinstance(value, list):
        return " ".join(str(item) for item in value)
    return str(value)


def ended_message(unit, invocation_id, how, elapsed, phase, tail, exit_info, cause):
    lines = "\n".join(redact_text(line) for line in tail) or "(no journal entries)"
    text = "%s: invocation %s %s after %.1fs, while %s" % (unit, invocation_id, how, elapsed, phase)
    if exit_info:
        text += " (%s)" % exit_info
    if cause:
        text += ". Cause: %s" % redact_text(cause)
    return "%s. Last %s journal lines of the invocation:\n%s" % (text, len(tail), lines)


def compared_text(intent, evidence_source, lines_compared, command_checked, environment_checked):
    """Which keys were compared, for the pass message; never 'agrees' when nothing was compared."""
    parts = []
    if intent.mode == "absent":
        parts.append("no draft-runner line, as intended (speculative decoding off)")
    elif intent.expect and lines_compared:
        keys = ", ".join("%s=%s" % (key, cfg.render(value)) for key, value in sorted(intent.expect.items()))
        where = {"receipt": "from the receipt of its verification",
                 "receipt+journal": "from the receipt of its verification and its journal since"}.get(
                     evidence_source, "in its journal")
        parts.append("%s (%s %s)" % (keys, "%s config lines" % lines_compared if lines_compared > 1 else "config line",
                                     where))
    if command_checked:
        parts.append("its command line")
    if environment_checked:
        parts.append("its environment")
    if not parts:
        return "nothing was compared (no expectation given): readiness only"
    return "compared " + "; ".join(parts)


def follower_passed(unit, invocation_id, compared, min_ready_seconds):
    """A follower node of a serving group passed: what its own evidence shows (it serves nothing to probe)."""
    settle = " and stayed up for min_ready_seconds %.0f since" % min_ready_seconds if min_ready_seconds > 0 else ""
    return ("%s: invocation %s joined its serving group as a follower node (its journal: every local scheduler "
            "ready%s; %s; the head's /generate is the group's)" % (unit, invocation_id, settle, compared))


def unverified_message(unit, invocation_id, reason, intent):
    return ("%s: invocation %s answers /generate, but there is no evidence that it runs the intended settings "
            "(%s): %s. Its config line was needed for %s. /server_info only echoes the parsed arguments and does not "
            "count." % (unit, invocation_id, "unverified", reason,
                        cfg.normalize_expect(intent.expect) if intent.mode != "absent"
                        else "proving speculative decoding is off"))


def completeness_reason(completeness, notices, unit, invocation_id, receipt_dir, storage=None):
    """Why the journal cannot show the config line; `storage` is journald's Storage= when known."""
    if storage == "none":
        return ("journald keeps no journal on this host (Storage=none in journald.conf, see `systemd-analyze "
                "cat-config systemd/journald.conf`), so nothing invocation %s logged can be read, and no receipt of a "
                "verification of this invocation is in %s" % (invocation_id, receipt_dir))
    if completeness == "lost":
        dropped = sum(notice.get("count") or 0 for notice in notices)
        return ("journald's rate limit dropped %s messages of %s during invocation %s (%s), so its config line "
                "was lost" % (dropped, unit, invocation_id, notices[-1].get("message")))
    if completeness == "no_start":
        return ("the journal no longer holds the start of invocation %s (its first line, server_args=, is gone: "
                "journal retention or vacuuming removed it), and no receipt of a verification of this invocation "
                "is in %s" % (invocation_id, receipt_dir))
    return ("nothing that SGLang logs after its config line has reached the journal yet, so it cannot be told "
            "whether journald dropped the line")


# ------------------------------------------------------------------ serving groups (one server across hosts)

def _first_line(text):
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else "no message"


def group_node_failed(group, host, rank, message, head=None, head_message=None):
    """A node failed its serving group: named first, with its own message (its journal's tail); the head's failure,
    when it followed, in one line after."""
    text = "serving group %s: node %s (rank %s) failed, so the group cannot serve: %s" % (
        group, host, rank, str(message or "no message").strip())
    if head_message:
        text += "\nIts head %s failed with it: %s" % (head, _first_line(head_message))
    return text


def group_not_joined(group, head, missing, head_message):
    """The head timed out while nodes had not joined: `missing` [(host, rank, where its wait stands)]."""
    ranks = "; ".join("rank %s (%s): %s" % (rank, host, where) for host, rank, where in missing)
    return ("serving group %s did not come up: its head %s waited for %s, which %s not joined the group - %s. "
            "Its head: %s" % (group, head, ", ".join("rank %s (%s)" % (rank, host) for host, rank, dummy in missing),
                              "has" if len(missing) == 1 else "have", ranks, _first_line(head_message)))


def group_head_failed(group, head, message):
    return "serving group %s: its head %s failed (its followers had not): %s" % (group, head, str(message or "").strip())
