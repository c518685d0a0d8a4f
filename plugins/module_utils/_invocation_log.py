# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the followed invocation of an SGLang unit logged, read as it arrives.

Private to this collection: no compatibility promise. All reads go through the one ``host``
object (_host.Host, a fake in unit tests).

Only the invocation's own entries are read (``_SYSTEMD_INVOCATION_ID``, and PID 1's notes about
it), incrementally: a follower that blocks until a line arrives, continued from a cursor by the
next slice of a wait; a running invocation that no wait restarted is searched, not read whole.
"""
from __future__ import annotations

import collections

from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._process import redact_text
from ansible_collections.gpufleet.inference.plugins.module_utils._startup import StartupLog, look_back

FLUSH_SECONDS = 2.0  # after a death: how long to wait for the last lines and systemd's notes
_EXIT_NOTES = ("Failed with result", "Deactivated", "Scheduled restart")  # systemd's last words on an invocation


class InvocationLog(object):
    """One invocation's journal as far as it was read (serialisable: ``to_state``).

    ``log`` (StartupLog): its startup phase and config lines; ``tail``: its last lines, secrets
    masked; ``cursor``: where reading goes on; ``own_cursor``: the last of the process's own
    entries (a receipt tells later checks to read on from there); ``receipt``: the receipt of its
    earlier verification, found when looking back at a running invocation.
    """

    def __init__(self, host, state=None, tail_lines=20, note=None):
        state = state or {}
        self.host = host
        self.log = StartupLog(state.get("log"))
        self.cursor = state.get("cursor")
        self.own_cursor = state.get("own_cursor")
        self.tail = collections.deque(state.get("tail", []), maxlen=tail_lines)
        self.receipt = state.get("receipt")
        self.note = note or (lambda text: None)
        self.follower = None

    def to_state(self):
        return {"log": self.log.to_state(), "cursor": self.cursor, "own_cursor": self.own_cursor,
                "tail": list(self.tail), "receipt": self.receipt}

    def reset(self):
        """Forget it (the next invocation is followed)."""
        self.close()
        self.log, self.cursor, self.own_cursor, self.receipt = StartupLog(), None, None, None
        self.tail.clear()

    def close(self):
        if self.follower is not None:
            self.follower.close()
            self.follower = None

    def follow(self, invocation_id, from_start, from_now=False):
        self.follower = self.host.follower(invocation_id, cursor=None if from_now else self.cursor,
                                           from_start=from_start and not self.cursor)

    def startup_known(self):
        """Its startup was judged before (a receipt) or logged past the config line's place."""
        return self.receipt is not None or self.log.after_config_seen

    def read(self, invocation_id, timeout, verify_only=False):
        """The entries that arrive within `timeout` (JournalError: the follower starts again next time)."""
        if self.follower is None:
            # Lines already read are behind the cursor; without one, only a running invocation whose
            # startup is already known may skip what it logged (a slice must not lose what was logged
            # between two slices).
            skip = self.cursor is None and verify_only and self.startup_known()
            self.follow(invocation_id, from_start=self.cursor is None and not skip, from_now=skip)
        try:
            entries = self.follower.read(timeout)
        except JournalError:
            self.follower = None
            raise
        if self.follower.cursor:
            self.cursor = self.follower.cursor
        self._take(entries)
        return entries

    def _take(self, entries):
        self.log.feed(entries)
        for entry in entries:
            if not entry.from_systemd:
                self.tail.append(redact_text(entry.message))
                self.own_cursor = entry.cursor or self.own_cursor

    def look_back(self, invocation_id):
        """A running invocation (no restart): its receipt, else its journal searched, not read whole."""
        # Where its journal ends BEFORE the search: a young invocation logs its first lines while we
        # search, and they must be read after it, not skipped (the first install has no previous
        # invocation to wait past: the wait starts here, maybe before SGLang logged anything).
        try:
            newest = self.host.last_cursor(invocation_id)
        except JournalError:
            newest = None
        found = look_back(self.host, invocation_id)
        self.log, self.receipt = found.log, found.receipt
        if found.note:
            self.note(found.note)
        for entry in found.entries:
            if not entry.from_systemd:
                self.tail.append(redact_text(entry.message))
        if found.entries and not self.startup_known() and found.entries[-1].cursor:
            self.cursor = self.own_cursor = found.entries[-1].cursor  # still starting up: follow on from there
            self.follow(invocation_id, from_start=False)
        else:
            # on from where its journal ended before the search (from its first entry when it had logged
            # nothing): what it logs while we search is read, never skipped (a line read twice counts once)
            self.cursor = self.own_cursor = newest
            self.follow(invocation_id, from_start=newest is None)

    def read_to_the_end(self, invocation_id, verify_only, tick):
        """Before a death is judged: its journal up to its end, so the phase and the last lines come from
        what it logged, not from where the wait happened to be (a slice starts without a follower; a
        process may die before its first line was read)."""
        if self.follower is None:
            if self.cursor is None and (verify_only or not self.log.lines_seen):
                if not self.log.lines_seen:
                    self._read_landmarks(invocation_id)
                self.read_tail(invocation_id)
                self._read_systemd_notes(invocation_id)
                return
            self.follow(invocation_id, from_start=self.cursor is None)
        deadline = self.host.clock() + FLUSH_SECONDS  # the last lines and systemd's exit notes may lag
        while self.host.clock() < deadline:
            try:
                entries = self.follower.read(min(tick, max(0.0, deadline - self.host.clock())))
            except JournalError:
                self.read_tail(invocation_id)
                return
            self._take(entries)
            if any(entry.from_systemd and any(note in entry.message for note in _EXIT_NOTES) for entry in entries):
                return
        self.log.take_events()

    def _read_systemd_notes(self, invocation_id):
        """How systemd saw it end (exit status, result, a stop job someone asked for)."""
        try:
            self.log.feed(self.host.systemd_notes(invocation_id))
        except JournalError as exc:
            self.note("could not read systemd's notes about invocation %s: %s" % (invocation_id, exc))
        self.log.take_events()

    def _read_landmarks(self, invocation_id):
        """The startup landmarks of an invocation that was never followed (a bounded search)."""
        try:
            entries = self.host.grep(invocation_id)
        except JournalError as exc:
            self.note("could not search the journal of invocation %s: %s" % (invocation_id, exc))
            return
        if entries:
            self.log.feed(entries)
            self.log.take_events()

    def restarts_since(self, after):
        """systemd's restarts (Restart=) of the unit since invocation `after` ended (a list, maybe empty)."""
        try:
            return self.host.restarts_since(after) or []
        except JournalError as exc:
            self.note("could not read systemd's restarts of %s: %s" % (self.host.unit, exc))
            return []

    def suppression_notices(self, invocation_id, since):
        """journald's "Suppressed N messages" notices about the invocation (a list, maybe empty)."""
        try:
            return self.host.suppressed(invocation_id, since) or []
        except JournalError as exc:
            self.note("could not look for journald suppression notices: %s" % exc)
            return []

    def read_tail(self, invocation_id, replace=False):
        """Its newest lines (those of `invocation_id`) in place of the tail kept so far: when there are
        any, or always (`replace`)."""
        if replace:
            self.tail.clear()
        try:
            messages = self.host.tail(invocation_id, self.tail.maxlen)
        except JournalError as exc:
            self.note("could not read the journal of invocation %s: %s" % (invocation_id, exc))
            return
        if messages:
            self.tail.clear()
            self.tail.extend(redact_text(message) for message in messages)
