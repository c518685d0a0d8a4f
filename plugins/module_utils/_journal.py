# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read ONE systemd invocation's journal entries, incrementally, with journalctl.

Private to this collection: no compatibility promise.

Hosts have no python-systemd, so this runs ``journalctl`` through an injected
``run(argv) -> (rc, out, err)`` (``module.run_command`` in modules, a table in tests).
Every query matches ``_SYSTEMD_INVOCATION_ID=<id>`` and is bounded: the first read takes at most
``batch`` of the newest entries, later reads continue with ``--after-cursor`` and ``-n batch``
(with a cursor, ``-n`` limits how many entries are printed going forward). The cost of a poll
therefore depends on what the process logged since the last poll, never on the journal's size.
"""
from __future__ import annotations

import collections
import json

# journald's own "Suppressed N messages from UNIT" notice (SD_MESSAGE_JOURNAL_DROPPED).
# SD_MESSAGE_JOURNAL_DROPPED (systemd/sd-messages.h), as journald writes it (checked on systemd 252).
JOURNAL_DROPPED_MESSAGE_ID = "a596d6fe7bfa4994828e72309e95d61e"


class JournalError(Exception):
    pass


def decode_message(value):
    """MESSAGE as journalctl's JSON gives it: str, null, or a list of byte values."""
    if value is None:
        return ""
    if isinstance(value, list):
        try:
            return bytes(bytearray(value)).decode("utf-8", "replace")
        except (TypeError, ValueError):
            return ""
    return str(value)


def parse_json_lines(text):
    """journalctl -o json output (one object per line) -> list of entry dicts."""
    entries = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


class Entry(object):
    __slots__ = ("message", "cursor", "realtime_usec", "pid", "fields")

    def __init__(self, fields):
        self.fields = fields
        self.message = decode_message(fields.get("MESSAGE"))
        self.cursor = fields.get("__CURSOR")
        try:
            self.realtime_usec = int(fields.get("__REALTIME_TIMESTAMP"))
        except (TypeError, ValueError):
            self.realtime_usec = None
        self.pid = fields.get("_PID")


class InvocationJournal(object):
    """The journal of one invocation, read forward from a cursor."""

    def __init__(self, run, invocation_id, batch=2000, max_batches=5, keep=20, journalctl="journalctl"):
        self.run = run
        self.invocation_id = invocation_id
        self.batch = batch
        self.max_batches = max_batches
        self.journalctl = journalctl
        self.cursor = None
        self.last_lines = collections.deque(maxlen=keep)
        self.first_realtime_usec = None
        # True when a read was capped: older (or skipped) entries were not seen by the stream,
        # so a config line may only be found with search_config().
        self.gaps = False
        self.entries_read = 0

    def _base(self):
        return [self.journalctl, "_SYSTEMD_INVOCATION_ID=%s" % self.invocation_id,
                "-o", "json", "--all", "--no-pager", "-q"]

    def _query(self, argv):
        rc, out, err = self.run(argv)
        if rc != 0:
            raise JournalError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or "").strip()))
        return [Entry(fields) for fields in parse_json_lines(out)]

    def _take(self, entries):
        for entry in entries:
            if entry.realtime_usec is not None and (self.first_realtime_usec is None
                                                    or entry.realtime_usec < self.first_realtime_usec):
                self.first_realtime_usec = entry.realtime_usec
            self.last_lines.append(entry.message)
        if entries and entries[-1].cursor:
            self.cursor = entries[-1].cursor
        self.entries_read += len(entries)

    def start(self, lines=None):
        """First read: the newest `lines` entries (default: batch). Returns them."""
        count = self.batch if lines is None else lines
        entries = self._query(self._base() + ["-n", str(count)])
        if len(entries) >= count:
            self.gaps = True
        self._take(entries)
        return entries

    def read_new(self):
        """Entries logged since the last read (at most batch * max_batches per call)."""
        if self.cursor is None:
            return self.start()
        result = []
        for dummy in range(self.max_batches):
            entries = self._query(self._base() + ["--after-cursor=%s" % self.cursor, "-n", str(self.batch)])
            self._take(entries)
            result.extend(entries)
            if len(entries) < self.batch:
                return result
        # Still more to read: the next call continues from the cursor; nothing is lost.
        return result

    def tail(self, lines=20):
        """The invocation's newest `lines` messages (independent of the cursor)."""
        try:
            entries = self._query(self._base() + ["-n", str(lines)])
        except JournalError:
            return list(self.last_lines)[-lines:]
        return [entry.message for entry in entries]

    def grep(self, pattern):
        """Messages of this invocation matching a PCRE2 pattern (journalctl --grep).

        Output is bounded by the number of matches (the config line is logged once per rank 0);
        no ``-n``: combined with --grep it would bound the entries searched, not the matches.
        Returns None when this journalctl cannot grep (built without PCRE2).
        """
        argv = self._base() + ["--grep", pattern]
        rc, out, err = self.run(argv)
        if rc != 0:
            text = (err or "").lower()
            if "pattern" in text or "grep" in text or "unrecognized option" in text:
                return None
            # journalctl --grep exits 1 when nothing matched
            if not (out or "").strip() and not text.strip():
                return []
            raise JournalError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or "").strip()))
        return [Entry(fields).message for fields in parse_json_lines(out)]


def suppressed_notices(run, unit, invocation_id, since, journalctl="journalctl"):
    """journald's "Suppressed N messages from UNIT" notices about `unit` since `since`.

    The notice is journald's own entry (SYSLOG_IDENTIFIER=systemd-journald, _TRANSPORT=driver),
    NOT tagged _SYSTEMD_INVOCATION_ID of the unit; it carries OBJECT_SYSTEMD_UNIT and, on most
    versions, OBJECT_SYSTEMD_INVOCATION_ID of the process that flooded (some versions write it
    with a stray leading '='). The query is bounded by MESSAGE_ID (indexed) and time.
    Returns a list of dicts: count, message, invocation_id (or None).
    """
    argv = [journalctl, "MESSAGE_ID=%s" % JOURNAL_DROPPED_MESSAGE_ID, "-o", "json", "--all",
            "--no-pager", "-q"]
    if since:
        argv += ["--since", since]
    rc, out, err = run(argv)
    if rc != 0:
        raise JournalError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or "").strip()))
    notices = []
    for fields in parse_json_lines(out):
        message = decode_message(fields.get("MESSAGE"))
        object_inv = (fields.get("OBJECT_SYSTEMD_INVOCATION_ID") or "").lstrip("=") or None
        object_unit = fields.get("OBJECT_SYSTEMD_UNIT")
        if object_inv:
            if object_inv != invocation_id:
                continue
        elif object_unit:
            if object_unit != unit:
                continue
        else:
            source = message.rsplit(" from ", 1)[-1].strip()
            if source != unit and not source.endswith("/" + unit):
                continue
        try:
            count = int(fields.get("N_DROPPED") or message.split()[1])
        except (IndexError, ValueError):
            count = None
        notices.append({"count": count, "message": message, "invocation_id": object_inv})
    return notices
