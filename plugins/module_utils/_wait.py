# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until the NEW SGLang process of a systemd unit runs the intended settings, and prove it.

Private to this collection: no compatibility promise.

The loop: look at the host (_host_view), ask the judge (_judge.judge) what that means, read what it
asks for, until it is done or the slice ends. Every decision is the judge's; every read goes through
the one ``host`` object (_host.Host, a fake in unit tests). What one slice hands the next is one
small record, ``WaitState``; the action plugin drives the slices and shows progress.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils import _judge as jd
from ansible_collections.gpufleet.inference.plugins.module_utils._host_view import HostView
from ansible_collections.gpufleet.inference.plugins.module_utils._invocation_log import InvocationLog
from ansible_collections.gpufleet.inference.plugins.module_utils._process import redact

# A slice returns early on a phase change, but not sooner than this: each slice is one module run (a
# connection from the controller and a Python start on the host). Phases a few seconds apart are shown
# together, at most this much later; a real load's phases are minutes apart.
MIN_SLICE_SECONDS = 5.0


@dataclass
class Followed:
    """Which invocation the wait follows, and systemd's restart count that tells a crash loop."""
    after: str | None = None              # the invocation waited past (None: verify the running one)
    invocation_id: str | None = None
    main_pid: int | None = None
    baseline_restarts: int | None = None  # NRestarts when it was first followed
    deaths: int = 0                       # restarts by systemd since `after`, tolerated ones included


@dataclass
class Found:
    """What the checks of the followed invocation established."""
    generate: dict | None = None  # its first good /generate answer
    listener: dict | None = None  # who listens on the port
    launched: dict | None = None  # what runs was checked (_judge.Launch.launched)
    evidence: str | None = None   # what the config-line evidence rests on (_judge.Snapshot.evidence)


@dataclass
class WaitState:
    """What one slice of the wait hands the next: the module's `state`, the next call's `resume`."""
    tracker: Followed
    journal: InvocationLog   # what the followed invocation logged, and where reading goes on
    found: Found = field(default_factory=Found)
    phase: str = "starting"  # where the wait is, in words
    phases: dict = field(default_factory=dict)  # when each phase was reached
    notes: list = field(default_factory=list)   # worth knowing about how the result was reached
    elapsed: float = 0.0     # seconds waited before this slice

    @classmethod
    def from_dict(cls, data, after_invocation, journal):
        data = data or {}
        tracker = data.get("tracker") or {"after": after_invocation or None}
        return cls(Followed(**tracker), journal, Found(**(data.get("found") or {})), data.get("phase", "starting"),
                   dict(data.get("phases") or {}), list(data.get("notes") or []), float(data.get("elapsed", 0.0)))

    def to_dict(self):
        """JSON-serialisable, no secrets."""
        return dict(tracker=asdict(self.tracker), journal=self.journal.to_state(), found=asdict(self.found),
                    phase=self.phase, phases=self.phases, notes=self.notes, elapsed=self.elapsed)

    def note(self, text):
        if text and text not in self.notes:
            self.notes.append(text)

    def follow_next(self):
        """A restart by systemd was tolerated: forget the invocation, wait for the next one."""
        self.tracker = Followed(after=self.tracker.invocation_id, deaths=self.tracker.deaths + 1)
        self.journal.reset()
        self.found = Found()
        for name in ("new_invocation", "config_line", "port_open", "generate"):
            self.phases.pop(name, None)


class Waiter(object):
    """One wait (or one slice of it): ``run()`` returns the last Judgement; ``result()`` the module's return."""

    def __init__(self, host, unit, intent, policy, after_invocation=None, resume=None):
        self.host, self.unit, self.intent, self.policy = host, unit, intent, policy
        journal = InvocationLog(host, (resume or {}).get("journal"), policy.tail_lines)
        self.state = WaitState.from_dict(resume, after_invocation, journal)
        journal.note = self.state.note  # what it could not read is worth knowing
        self.view = HostView(host, unit, intent, policy, self.state)
        self.journal_tail = self.receipt_written = None

    def run(self, slice_seconds=None):
        view = self.view
        view.started = self.host.clock()
        try:
            while True:
                judgement = self._look_at_host()
                if judgement.done:
                    return self._finish(judgement)
                spent = self.host.clock() - view.started
                if slice_seconds and (spent >= slice_seconds or (view.phase_changed and spent >= MIN_SLICE_SECONDS)):
                    return jd.Judgement(jd.WAITING, "%s: still waiting after %.1fs: %s" % (
                        self.unit, view.elapsed(), self.state.phase))
        finally:
            self.state.journal.close()

    def _look_at_host(self):
        """One look: what is due, then the judge, and whatever it asks for (each at most once)."""
        view = self.view
        view.watch()
        looks = {}
        while True:
            judgement = jd.judge(view.snapshot(looks))
            established = self._keep(judgement)
            if judgement.done or judgement.look in looks or (judgement.look is None and not established):
                break
            if judgement.look == jd.UNIT:
                view.unit_stale = True
                break
            if judgement.look is not None:
                looks[judgement.look] = view.look(judgement.look, looks)
        if not judgement.done and self.state.tracker.invocation_id is None:
            self.host.sleep(max(0.0, min(self.policy.tick * 2, view.remaining())))
        return judgement

    def _keep(self, judgement):
        """Keep what the judgement established; True when that may change the next judgement."""
        state = self.state
        established = bool(judgement.note and judgement.note not in state.notes) or bool(
            judgement.evidence and state.found.evidence is None)
        state.note(judgement.note)
        state.found.evidence = state.found.evidence or judgement.evidence
        if judgement.event:
            self.view.event(*judgement.event)
        if not judgement.done:
            state.phase = jd.with_error(judgement.message, self.view.read_error)
        return established

    def _finish(self, judgement):
        tracker, journal = self.state.tracker, self.state.journal
        if judgement.verdict in jd.ENDED:
            self.journal_tail = list(journal.tail)
        snap = self.view.snapshot()
        if judgement.verdict == jd.PASS and jd.receipt_due(snap):
            receipt = ev.make_receipt(self.unit, tracker.invocation_id, tracker.main_pid, self.intent.expect,
                                      self.intent.mode, snap.lines,
                                      redact(self.intent.command) if self.intent.command else None, self.host.wall(),
                                      journal_cursor=journal.own_cursor)
            try:
                self.host.write_receipt(receipt)
                self.receipt_written = self.host.receipt_path
            except (IOError, OSError) as exc:
                self.state.note("could not write the verification receipt %s: %s" % (self.host.receipt_path, exc))
        return judgement

    def to_state(self):
        """Everything the next slice needs (JSON-serialisable, no secrets)."""
        return dict(self.state.to_dict(), elapsed=self.view.elapsed())

    def result(self):
        state, found, view = self.state, self.state.found, self.view
        lines = ev.judged_lines(state.journal.receipt, state.journal.log.config_lines)
        return dict(
            invocation_id=state.tracker.invocation_id, main_pid=state.tracker.main_pid,
            unit_state=view.unit_state.as_dict() if view.unit_state is not None else None,
            expected=self.intent.expect, config_line_mode=self.intent.mode,
            observed=lines[-1]["values"] if lines else None, config_line=lines[-1].get("line") if lines else None,
            config_lines=[line.get("line") for line in lines],
            source=found.evidence if found.evidence in ("journal", "receipt", "receipt+journal") else None,
            verified=found.evidence not in (None, jd.ACCEPTED), elapsed=view.elapsed(), phases=state.phases,
            phase=state.phase, generate=found.generate, listener=found.listener, launched=found.launched,
            journal_tail=self.journal_tail, suppression=view.suppression, receipt=self.receipt_written,
            notes=state.notes, events=view.events)
