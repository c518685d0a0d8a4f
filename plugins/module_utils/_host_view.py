# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the wait sees of the host: every read of it, kept in the wait's record, shown to the judge.

Private to this collection: no compatibility promise. All reads go through the one ``host`` object
(_host.Host, a fake in unit tests).

At each look, ``HostView.watch()`` reads systemd's view of the unit when it is due (at least every
``state_interval``, at once when the main process is gone or systemd logged about the invocation),
then the followed invocation's journal (_invocation_log), blocking until a line arrives or a tick
passes: a new line is seen at once, a quiet process costs nothing. ``look(name)`` reads what the
judge asks for (_judge's looks); ``snapshot()`` is what the judge reads.
"""
from __future__ import annotations

from types import MappingProxyType

from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils import _judge as jd
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import generate_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils._startup import describe_phase
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import SystemdError

EXCERPT_CHARS = 200
# Phase changes that end a slice early (progress shows at once): the long stretches of a start.
# From the config line on, readiness is seconds away: a slice then runs on, so the relaunch of
# the next slice never sits between the port opening and the wait noticing it.
EARLY_RETURN_PHASES = ("waiting", "new_invocation", "invocation", "rendezvous", "loading_weights", "weights_loaded",
                       "kv_cache", "cuda_graph")
POKE_SECONDS = 2.0  # journal_grace: how often a /generate makes the idle server log a line


class HostView(object):
    """The host as one wait (or one slice of it) sees it. ``state`` is the wait's record (_wait.WaitState)."""

    def __init__(self, host, unit, intent, policy, state):
        self.host, self.unit, self.intent, self.policy, self.state = host, unit, intent, policy, state
        self.unit_state = None  # systemd's view at the last look
        self.unit_stale = True  # look at systemd first, and again once it logged about the invocation
        self.unit_read_at = self.started = self.poked_at = self.suppression = None
        self.read_errors = {}  # systemd / journal -> why its last read failed (until one succeeds)
        self.events = []
        self.phase_changed = False  # since the slice started, a phase of EARLY_RETURN_PHASES began

    @property
    def read_error(self):
        return "; ".join(str(error) for error in self.read_errors.values()) or None

    def elapsed(self):
        spent = self.host.clock() - self.started if self.started is not None else 0.0
        return round(self.state.elapsed + spent, 3)

    def remaining(self):
        return self.policy.timeout - self.elapsed()

    def event(self, phase, text, phase_change=True):
        self.events.append({"elapsed": self.elapsed(), "phase": phase, "text": text})
        self.phase_changed = self.phase_changed or (phase_change and phase in EARLY_RETURN_PHASES)

    def mark(self, name, **extra):
        if name not in self.state.phases:
            self.state.phases[name] = dict(extra, elapsed=self.elapsed(), at=self.host.wall_iso())

    def snapshot(self, looks=None):
        state, tracker, journal, found = self.state, self.state.tracker, self.state.journal, self.state.found
        return jd.Snapshot(
            unit=self.unit, intent=self.intent, policy=self.policy, after=tracker.after,
            invocation_id=tracker.invocation_id, baseline_restarts=tracker.baseline_restarts or 0,
            deaths=tracker.deaths, unit_state=self.unit_state, unit_stale=self.unit_stale,
            journal_lines=tuple(journal.log.config_lines), receipt=journal.receipt, receipt_path=self.host.receipt_path,
            start_seen=journal.log.start_seen, after_config_seen=journal.log.after_config_seen,
            lines_seen=journal.log.lines_seen, joined_at=journal.log.joined_at, startup=journal.log.describe(),
            exit_info=journal.log.exit, stop_job=journal.log.stop_job,
            tail=tuple(journal.tail), generate=found.generate,
            generate_elapsed=state.phases.get("generate", {}).get("elapsed"), launched=found.launched,
            evidence=found.evidence, notes=tuple(state.notes), phase=state.phase, last_error=self.read_error,
            elapsed=self.elapsed(), wall=self.host.wall(), looks=MappingProxyType(dict(looks or {})))

    # --- what is read at every look --------------------------------------------------------------

    def watch(self):
        """systemd's view when due, then the followed invocation's journal for up to a tick."""
        if self._unit_due():
            self._read_unit()
        if self.state.tracker.invocation_id is not None:
            self._read_journal(max(0.0, min(self.policy.tick, self.remaining())))

    def _unit_due(self):
        tracker = self.state.tracker
        if self.unit_stale or self.unit_read_at is None or tracker.invocation_id is None:
            return True
        if tracker.main_pid and not self.host.alive(tracker.main_pid):
            return True
        return self.host.clock() - self.unit_read_at >= self.policy.state_interval

    def _read_unit(self):
        try:
            state = self.host.state()
        except SystemdError as exc:
            self.read_errors["systemd"] = exc
            return
        self.read_errors.pop("systemd", None)
        self.unit_state, self.unit_read_at, self.unit_stale = state, self.host.clock(), False
        tracker = self.state.tracker
        if tracker.invocation_id and state.invocation_id == tracker.invocation_id and state.main_pid:
            tracker.main_pid = state.main_pid

    def _read_journal(self, timeout):
        tracker, journal = self.state.tracker, self.state.journal
        try:
            entries = journal.read(tracker.invocation_id, timeout, verify_only=tracker.after is None)
        except JournalError as exc:
            self.read_errors["journal"] = exc  # the follower starts again from the cursor at the next look
            self.host.sleep(max(0.0, min(self.policy.tick, self.remaining())))
            return
        self.read_errors.pop("journal", None)
        self.unit_stale = self.unit_stale or any(entry.from_systemd for entry in entries)
        for phase, detail in journal.log.take_events():
            if self.state.found.generate is None or phase == "draft_runner":  # after the first answer: what matters
                self.event(phase, describe_phase(phase, detail), phase_change=detail is None or phase == "draft_runner")
        self._mark_found()

    def _mark_found(self):
        """The phases the journal marks: the config line, a follower's joining its group."""
        lines = ev.judged_lines(self.state.journal.receipt, self.state.journal.log.config_lines)
        if lines:
            self.mark("config_line", logged_at=lines[0].get("timestamp"))
        if self.state.journal.log.joined_at is not None:
            self.mark("joined", logged_at=self.state.journal.log.joined_at)

    # --- what the judge asks for (_judge's looks) ------------------------------------------------

    def look(self, look, looks):
        """Read what the judge asked for, keep what the result reports, and return what was seen."""
        host, tracker, journal = self.host, self.state.tracker, self.state.journal
        timeout = min(self.policy.request_timeout, max(self.remaining(), 0.1))
        reads = {
            jd.FOLLOW: self._follow,
            jd.FOLLOW_NEXT: self.state.follow_next,
            jd.READ_TO_END: lambda: journal.read_to_the_end(tracker.invocation_id, tracker.after is None,
                                                            self.policy.tick),
            jd.CRASHED_TAIL: lambda: journal.read_tail(looks[jd.FOLLOW][0]["invocation_id"], replace=True),
            jd.PORT: lambda: host.port_open(min(1.0, max(self.remaining(), 0.1))),
            jd.LISTENER: lambda: host.listener(self.unit_state.control_group, tracker.main_pid),
            jd.GENERATE: lambda: host.generate(timeout),
            jd.LAUNCH: lambda: read_launch(host, self.intent, self.unit, tracker.main_pid),
            jd.UNIT_FLAGS: lambda: read_unit_flags(host, self.intent),
            jd.NOTICES: lambda: journal.suppression_notices(tracker.invocation_id, self.unit_state.start_timestamp),
            jd.STORAGE: host.journal_storage,
            jd.POKE: lambda: self._poke(timeout),
            jd.SETTLE_PROBE: lambda: host.generate(timeout),
        }
        seen = reads[look]()
        self._keep(look, seen)
        return seen

    def _keep(self, look, seen):
        found = self.state.found
        if look == jd.PORT and seen and "port_open" not in self.state.phases:
            self.mark("port_open")
            self.event("port_open", "port open")
        elif look == jd.LISTENER and seen is not None:
            found.listener = seen
        elif look == jd.GENERATE and generate_verdict(seen)[0]:
            dummy, text, meta = generate_verdict(seen)
            found.generate = {"status": seen.status, "text": text[:EXCERPT_CHARS], "meta_info": meta}
            self.mark("generate")
            self.event("generate", "/generate answered (%s tokens%s)" % (meta.get("completion_tokens", "?"), (
                ", accept length %s" % meta["spec_accept_length"]) if meta.get("spec_accept_length") is not None
                else ""))
        elif look == jd.LAUNCH and seen is not None:
            found.launched = seen.launched
            for note in seen.notes:
                self.state.note(note)
        elif look == jd.NOTICES and seen:
            self.suppression = {"messages_dropped": sum(notice.get("count") or 0 for notice in seen),
                                "notices": [notice.get("message") for notice in seen]}

    def _follow(self):
        """Follow the invocation the unit shows; what it returns: systemd's restarts since `after`."""
        state, tracker, journal = self.unit_state, self.state.tracker, self.state.journal
        tracker.invocation_id, tracker.main_pid, tracker.baseline_restarts = (
            state.invocation_id, state.main_pid, state.n_restarts)
        if state.crashed:
            return []
        name = "new_invocation" if tracker.after else "invocation"
        self.mark(name, invocation_id=state.invocation_id, process_start=state.start_timestamp or None,
                  main_pid=state.main_pid)
        self.event(name, "%s %s, main PID %s" % ("new invocation" if tracker.after else "running invocation",
                                                 state.invocation_id, state.main_pid))
        if tracker.after is None:
            journal.look_back(state.invocation_id)
            self._mark_found()
            return []
        restarts = journal.restarts_since(tracker.after)
        tracker.deaths += len(restarts)
        return restarts

    def _poke(self, timeout):
        if self.poked_at is None or self.elapsed() - self.poked_at >= POKE_SECONDS:
            self.poked_at = self.elapsed()
            self.host.generate(timeout)


def read_launch(host, intent, unit, pid):
    """What runs (a _judge.Launch): the main process's command line and environment, the effective
    unit's; None while the command line cannot be read yet (the process is still inside exec)."""
    argv = effective = error = running = None
    if intent.command is not None:
        argv = host.cmdline(pid)
        if argv is None:
            return None
    if intent.environment is not None:
        try:
            effective = host.effective()
        except SystemdError as exc:
            error = exc
        running = host.environ(pid, list(intent.environment))
    return jd.launch_check(intent, unit, pid, argv, effective, error, running)


def read_unit_flags(host, intent):
    """The unit's flags for each expected key and the command line it runs (intended, else its ExecStart)."""
    argv = intent.command
    if argv is None:
        try:
            effective = host.effective()
            argv = effective.exec_start[0] if effective.exec_start else []
        except SystemdError:
            argv = []
    return jd.UnitFlags(dict((key, tuple(host.flags_for_key(key) or ())) for key in intent.expect), tuple(argv))
