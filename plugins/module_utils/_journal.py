# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read ONE systemd invocation's journal entries, incrementally, with journalctl.

Private to this collection: no compatibility promise.

Hosts have no python-systemd, so this runs ``journalctl`` through an injected
``run(argv) -> (rc, out, err)`` (``module.run_command`` in modules, a table in tests), or follows
it (``JournalFollower``). Every query matches ``_SYSTEMD_INVOCATION_ID=<id>`` (an indexed field)
and is bounded: the newest N lines, a --grep for a few landmarks, or what arrives after a cursor.
Its cost never depends on the unit's other invocations.
"""
from __future__ import annotations

import collections
import json
import os
import time

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
    """One journal entry: the process's own line, or systemd's message about its invocation.

    Provenance rests only on fields journald sets itself (``_``-fields, which no client can
    write): ``_SYSTEMD_INVOCATION_ID`` comes from the cgroup of the process that logged, so only
    the unit's own processes carry the invocation's id there. systemd's messages about the unit
    carry the id in ``INVOCATION_ID=``, a field ANY client may set: they count only when PID 1
    (``_PID=1``, root) wrote them.
    """
    __slots__ = ("message", "cursor", "realtime_usec", "pid", "fields", "from_systemd", "invocation_id",
                 "about_invocation")

    def __init__(self, fields):
        self.fields = fields
        self.message = decode_message(fields.get("MESSAGE"))
        self.cursor = fields.get("__CURSOR")
        try:
            self.realtime_usec = int(fields.get("__REALTIME_TIMESTAMP"))
        except (TypeError, ValueError):
            self.realtime_usec = None
        self.pid = fields.get("_PID")
        self.invocation_id = fields.get("_SYSTEMD_INVOCATION_ID")
        self.from_systemd = (self.invocation_id is None and self.pid == "1" and fields.get("_UID", "0") == "0"
                             and "INVOCATION_ID" in fields)
        self.about_invocation = fields.get("INVOCATION_ID") if self.from_systemd else None

    def belongs_to(self, invocation_id):
        """Written by a process of the invocation, or by systemd about it (trusted fields only)."""
        return self.invocation_id == invocation_id or self.about_invocation == invocation_id


class InvocationJournal(object):
    """Bounded queries of one invocation's journal: its newest lines, and a search."""

    def __init__(self, run, invocation_id, journalctl="journalctl"):
        self.run = run
        self.invocation_id = invocation_id
        self.journalctl = journalctl

    def _base(self):
        return [self.journalctl, "_SYSTEMD_INVOCATION_ID=%s" % self.invocation_id,
                "-o", "json", "--all", "--no-pager", "-q"]

    def _query(self, argv):
        rc, out, err = self.run(argv)
        if rc != 0:
            raise JournalError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or "").strip()))
        return self._own(parse_json_lines(out))

    def _own(self, records):
        return [entry for entry in (Entry(fields) for fields in records) if entry.belongs_to(self.invocation_id)]

    def tail(self, lines=20):
        """The invocation's newest `lines` messages."""
        return [entry.message for entry in self._query(self._base() + ["-n", str(lines)])]

    def systemd_notes(self, lines=10):
        """PID 1's newest notes about the invocation (started, stopping, exit status, result): matched on
        ``_PID=1``, which journald sets; ``INVOCATION_ID=`` alone any client may write."""
        argv = [self.journalctl, "_PID=1", "INVOCATION_ID=%s" % self.invocation_id, "-o", "json", "--all",
                "--no-pager", "-q", "-n", str(lines)]
        return [entry for entry in self._query(argv) if entry.from_systemd]

    def last_cursor(self):
        """The cursor of the invocation's newest entry, or None when it has logged nothing yet."""
        entries = self._query(self._base() + ["-n", "1"])
        return entries[-1].cursor if entries else None

    def grep_entries(self, pattern, after_cursor=None):
        """Entries of this invocation whose message matches a PCRE2 pattern (journalctl --grep),
        all of them or those after `after_cursor` - which must be the cursor of one of the process's
        own entries (``_SYSTEMD_INVOCATION_ID``): journalctl (systemd 252) skips one entry too many
        after a cursor whose entry the query does not match.

        Output is bounded by the number of matches (a few startup landmarks); no ``-n``: combined
        with --grep it would bound the entries searched, not the matches.
        Returns None when this journalctl cannot grep (built without PCRE2).
        """
        argv = self._base() + ["--grep", pattern]
        if after_cursor:
            argv.append("--after-cursor=%s" % after_cursor)
        rc, out, err = self.run(argv)
        if rc != 0:
            text = (err or "").lower()
            if "pattern" in text or "grep" in text or "unrecognized option" in text:
                return None
            # journalctl --grep exits 1 when nothing matched
            if not (out or "").strip() and not text.strip():
                return []
            raise JournalError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or "").strip()))
        return self._own(parse_json_lines(out))

    def grep(self, pattern):
        """Messages of this invocation matching `pattern` (see grep_entries); None without PCRE2."""
        entries = self.grep_entries(pattern)
        return None if entries is None else [entry.message for entry in entries]


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
        if fields.get("_TRANSPORT") != "driver":
            continue  # journald writes its notices itself (_TRANSPORT=driver); a client may only imitate one
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


# SD_MESSAGE_UNIT_RESTART_SCHEDULED: systemd's "Scheduled restart job, restart counter is at N." (systemd 252)
RESTART_SCHEDULED_MESSAGE_ID = "5eb03494b6584870a536b337290809b3"


def restarts_since(run, unit, invocation_id, journalctl="journalctl"):
    """Every restart systemd scheduled for `unit` (Restart=) after `invocation_id` ended, oldest first:
    list of {invocation_id (the one that ended), n_restarts, message}. None when the journal no longer
    holds that invocation's end, so nothing can be told.

    Both queries match PID 1's own entries (``_PID=1``, set by journald): UNIT= and INVOCATION_ID= are
    fields any client may write.
    """
    base = [journalctl, "-o", "json", "--all", "--no-pager", "-q"]
    argv = base + ["-n", "1", "_PID=1", "INVOCATION_ID=%s" % invocation_id]
    rc, out, err = run(argv)
    if rc != 0:
        raise JournalError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or "").strip()))
    ended = [Entry(fields) for fields in parse_json_lines(out)]
    if not ended or ended[-1].realtime_usec is None or not ended[-1].from_systemd:
        return None
    # Bounded by time, not by --after-cursor: journalctl (systemd 252) skips one matching entry too many
    # after a cursor whose own entry does not match the query.
    end = ended[-1].realtime_usec
    argv = base + ["--since=@%d.%06d" % (end // 1000000, end % 1000000), "_PID=1",
                   "MESSAGE_ID=%s" % RESTART_SCHEDULED_MESSAGE_ID, "UNIT=%s" % unit]
    rc, out, err = run(argv)
    if rc != 0:
        raise JournalError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or "").strip()))
    restarts = []
    for entry in (Entry(fields) for fields in parse_json_lines(out)):
        if not entry.from_systemd or entry.realtime_usec is None or entry.realtime_usec <= end:
            continue
        try:
            count = int(entry.fields.get("N_RESTARTS"))
        except (TypeError, ValueError):
            count = None
        restarts.append({"invocation_id": entry.about_invocation, "n_restarts": count, "message": entry.message})
    return restarts


class JournalFollower(object):
    """One invocation's entries as journald stores them, as they arrive.

    Follows ``_SYSTEMD_INVOCATION_ID=<id>`` (the process's own output) ``+ INVOCATION_ID=<id>``
    (systemd's messages about that invocation: Started, Main process exited, Failed with result)
    with ``journalctl --follow``. A read blocks in select() until entries arrive or the timeout
    ends, so a quiet process costs the host nothing and a new line is seen at once. Continues
    after ``cursor`` when given (the next slice of a wait), else from the invocation's first
    entry (``from_start``) or from now.

    ``spawn(argv)`` starts the process (``subprocess.Popen`` in modules, a fake in tests); it must
    return an object with ``stdout`` (a binary pipe), ``poll()``, ``kill()`` and ``wait()``.
    """

    def __init__(self, spawn, invocation_id, cursor=None, from_start=True, journalctl="journalctl",
                 keep=20, select=None):
        self.spawn = spawn
        self.invocation_id = invocation_id
        self.cursor = cursor
        self.from_start = from_start
        self.journalctl = journalctl
        self.last_lines = collections.deque(maxlen=keep)
        self.entries_read = 0
        self.foreign = 0  # entries the match let through that neither the invocation nor systemd wrote
        self.proc = None
        self._buffer = b""
        self._select = select

    def argv(self):
        argv = [self.journalctl, "--follow", "-o", "json", "--all", "--no-pager", "-q"]
        if self.cursor:
            argv.append("--after-cursor=%s" % self.cursor)
        elif self.from_start:
            argv.append("--no-tail")
        else:
            argv += ["-n", "0"]
        return argv + ["_SYSTEMD_INVOCATION_ID=%s" % self.invocation_id, "+",
                       "INVOCATION_ID=%s" % self.invocation_id]

    def _ensure_started(self):
        if self.proc is None:
            try:
                self.proc = self.spawn(self.argv())
            except OSError as exc:
                raise JournalError("could not start %s: %s" % (self.journalctl, exc))

    def read(self, timeout):
        """Entries that arrived within `timeout` seconds (possibly none)."""
        self._ensure_started()
        select_fn = self._select
        if select_fn is None:
            import select as select_module
            select_fn = select_module.select
        fd = self.proc.stdout
        entries = []
        ready, dummy, dummy = select_fn([fd], [], [], max(0.0, timeout))
        while ready:
            chunk = os.read(fd.fileno(), 1 << 16)
            if not chunk:  # its output closed: it has ended, or is about to
                self._check_alive(force=True)
                if self.proc is not None:
                    time.sleep(max(0.0, min(timeout, 0.05)))
                break
            self._buffer += chunk
            # Whatever else is already buffered, without waiting again.
            ready, dummy, dummy = select_fn([fd], [], [], 0)
        if b"\n" in self._buffer:
            complete, self._buffer = self._buffer.rsplit(b"\n", 1)
            for line in complete.split(b"\n"):
                entries.extend(self._parse(line))
        if entries and entries[-1].cursor:
            self.cursor = entries[-1].cursor  # past what was read, kept or not
        own = [entry for entry in entries if entry.belongs_to(self.invocation_id)]
        self.foreign += len(entries) - len(own)
        entries = own
        self._check_alive()
        for entry in entries:
            if not entry.from_systemd:
                self.last_lines.append(entry.message)
        self.entries_read += len(entries)
        return entries

    @staticmethod
    def _parse(line):
        line = line.strip()
        if not line.startswith(b"{"):
            return []
        try:
            return [Entry(json.loads(line.decode("utf-8", "replace")))]
        except ValueError:
            return []

    def _check_alive(self, force=False):
        rc = self.proc.poll()
        if rc is not None and (force or rc != 0):
            err = b""
            if getattr(self.proc, "stderr", None) is not None:
                try:
                    err = self.proc.stderr.read() or b""
                except (IOError, OSError):
                    err = b""
            self.proc = None
            raise JournalError("%s --follow ended (rc=%s): %s" % (
                self.journalctl, rc, err.decode("utf-8", "replace").strip() or "no error output"))

    def close(self):
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait()
            except OSError:
                pass
            self.proc = None
