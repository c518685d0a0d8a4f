# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host path of a serving group: one SGLang server across hosts, changed, verified and reverted as one.

Private to this collection: no compatibility promise. Controller-side and free of Ansible, as _hostpath is:
each node is a HostPath whose ``run`` and ``wait`` reach that node (the head's task reaches its followers
through plugin_utils/_nodes.py); its steps, leases and messages are the host path's own.

The order is SGLang's (the guide's multi-node page, measured by tests/benchmarks/bench_group_order.py):

- install what differs on every node, restarting nothing;
- stop every node, head first, each until it is inactive: the head's drain shuts every node's schedulers
  down (KillMode=mixed, 0.5.19+), so the followers end cleanly; a follower stopped while its head runs
  fails the head, which systemd would restart into a half-stopped group;
- start every node at once, followers first: every rank waits for the others up to --dist-timeout;
- wait for the group: the head with the full contract (its /generate answers only once every node has
  joined), each follower looked at between the head's slices - a follower that dies or crash-loops fails
  the group at once, named - then each follower verified by its own evidence (_judge's follower mode).

A failure names the node that caused it; a revert puts the last-known-good files back on every node and
restarts the group the same way.
"""
from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils import _hostpath as hp
from ansible_collections.gpufleet.inference.plugins.module_utils import _messages as msgs
from ansible_collections.gpufleet.inference.plugins.module_utils import _records

WAIT_GROUP = "Wait until every node of the serving group runs the intended settings (its head serves)"
REVERT_GROUP = "Revert every node of the serving group to its last-known-good unit and verify the group"
# While the head loads, its followers are looked at between its slices: at least this often.
WATCH_SECONDS = 10.0
# One look at a follower: a short slice of its own wait, from where the last look left it.
LOOK_SECONDS = 1.0
# A unit that never ran has no InvocationID: any invocation it gets is new (an InvocationID is hex digits).
NO_INVOCATION = "none"
# sglang_ready's verdicts that leave a wait going.
GOING = ("waiting",)


class FollowerWatch(object):
    """The followers looked at between the head's slices: each look is one short slice of the follower's own wait.
    A follower whose wait ends in failure fails the group (StepFailed naming it); one that passed is left alone
    (it is verified again once the head passed)."""

    def __init__(self, group, followers):
        self.group = group
        self.pending = dict((host, {"args": args, "state": None}) for host, args in followers.items())
        self.seen = {}  # host -> its last answer

    def look(self, fail=True):
        """One slice of every follower still pending; with `fail`, a follower that failed raises."""
        for host in list(self.pending):
            item = self.pending[host]
            path = self.group.paths[host]
            if path.lease is not None:
                path.lease.renew_if_due()
            args = dict(item["args"], slice_seconds=LOOK_SECONDS, progress=False)
            if item["state"] is not None:
                args["resume"] = item["state"]
            answer = path.run(hp.READY, args)
            verdict = answer.get("verdict")
            if answer.get("unreachable") or not verdict:
                continue  # the connection, not the follower: a later look (or its own wait) tells
            self.seen[host] = answer
            if verdict in GOING:
                item["state"] = answer.get("state")
                continue
            del self.pending[host]
            if verdict != "pass" and fail:
                raise hp.StepFailed(WAIT_GROUP, self.group.node_failure(host, answer))
        return self.seen


class GroupPath(object):
    """The steps of one serving group. ``group``: its description (the drift check's ``prepared.group``: name, head,
    followers, ranks); ``paths``: host -> HostPath of every node. Offers what the rollout uses of a HostPath."""

    def __init__(self, group, paths):
        self.group = group
        self.paths = paths
        self.name = group["name"]
        self.head_host = group["head"]
        self.followers = list(group.get("followers") or [])
        self.head = paths[self.head_host]
        self.saved = {}  # host -> (last-known-good saved, error), after save_last_good

    @property
    def hosts(self):
        """Head first: the order to stop in."""
        return [self.head_host] + self.followers

    @property
    def changed(self):
        return any(path.changed for path in self.paths.values())

    @property
    def reverted_config(self):
        return self.head.reverted_config

    def rank(self, host):
        return (self.group.get("ranks") or {}).get(host)

    def say(self, text):
        self.head.say(text)

    # ------------------------------------------------------------------ before the change

    def check_blocking(self):
        for host in self.hosts:
            self.paths[host].check_blocking()

    def secret_files(self):
        for host in self.hosts:
            self.paths[host].secret_files()

    def adopt_last_good(self):
        return dict((host, self.paths[host].adopt_last_good()) for host in self.hosts)

    def has_last_good(self):
        return all(self.paths[host].has_last_good() for host in self.hosts)

    # ------------------------------------------------------------------ apply

    def apply(self):
        """Install what differs on every node; when any node must restart (or does not run), restart the group and
        wait for it, else verify what runs. The head's verification, with every node's under ``nodes``."""
        installed = dict((host, self.paths[host].install(restart=False)) for host in self.hosts)
        due = [host for host in self.hosts if installed[host]["restart_due"] or self.paths[host].not_running()]
        if not due:
            return self.verified(None)
        self.say("serving group %s: restarting every node (%s must change)" % (self.name, ", ".join(due)))
        return self.verified(self.restart())

    def restart(self, running=None):
        """Stop every node (head first, each until inactive), then start every node at once (followers first):
        {host: the invocation each start replaces - the stop's reading, else `running`'s (host: the invocation seen
        running last), else the drift check's}."""
        previous = {}
        for host in self.hosts:
            stopped = self.paths[host].stop()
            previous[host] = ((stopped.get("status") or {}).get("InvocationID") or (running or {}).get(host) or
                              self.paths[host].drift.get("invocation_id") or NO_INVOCATION)
        for host in self.followers + [self.head_host]:
            self.paths[host].start_node()
        return previous

    def verified(self, previous):
        """The verification of every node after `previous` ({host: invocation replaced}; None: nothing restarted)."""
        head = self.head
        if not head.settings.get("sglang_verify", True):
            nodes = dict((host, self.paths[host].verified(None) if previous is None else _records.verification(
                [{}, {}, dict(self.paths[host].drift, host=host)], restarted=True)) for host in self.hosts)
        elif previous is None:
            nodes = {}
            for host in self.hosts:
                try:
                    nodes[host] = self.paths[host].verified(None)
                except hp.StepFailed as failed:
                    if host == self.head_host:
                        raise
                    raise hp.StepFailed(failed.step, self.node_failure(host, failed.result))
        else:
            args = dict((host, hp.wait_args(path.settings, path.url, path.prepared.get("intent") or {},
                                            after=previous[host], api_key=path.settings.get("sglang_api_key")))
                        for host, path in self.paths.items())
            waits = self.wait(args)
            nodes = dict((host, _records.verification([waits[host], {}, dict(self.paths[host].drift, host=host)],
                                                      restarted=True)) for host in self.hosts)
        return dict(nodes[self.head_host], nodes=nodes, group=self.name)

    def wait(self, args, step=hp.WAIT):
        """The head's wait (the full contract), its followers looked at between its slices, then each follower's own
        wait: {host: result}. Raises StepFailed naming the node that failed the group."""
        watch = FollowerWatch(self, dict((host, args[host]) for host in self.followers))
        head_args = dict(args[self.head_host], slice_seconds=min(
            float(args[self.head_host].get("slice_seconds") or hp.SLICE_SECONDS), WATCH_SECONDS))
        try:
            results = {self.head_host: self.head._wait(step, head_args, between=watch.look)}
        except hp.StepFailed as failed:
            if failed.step == WAIT_GROUP:
                raise  # a follower failed while the head loaded: named already
            raise hp.StepFailed(WAIT_GROUP, self.head_failure(failed.result, watch))
        for host in self.followers:
            try:
                results[host] = self.paths[host]._wait(step, args[host])
            except hp.StepFailed as failed:
                raise hp.StepFailed(WAIT_GROUP, self.node_failure(host, failed.result))
        return results

    # ------------------------------------------------------------------ what failed

    def node_failure(self, host, answer):
        """A follower's failed wait as the group's failure: the node named first, its own message (its journal's tail)."""
        return dict(answer, failed=True, node=host, msg=msgs.group_node_failed(
            self.name, host, self.rank(host), answer.get("msg")))

    def head_failure(self, result, watch):
        """The head's failed wait as the group's: a follower that died meanwhile is the cause, named first; a head
        that timed out (or died: SGLang ends it when --dist-timeout runs out) names the followers that have not
        joined."""
        seen = watch.look(fail=False) if watch.pending else watch.seen
        for host in self.followers:
            answer = seen.get(host) or {}
            if answer.get("verdict") not in (None, "pass") + GOING:
                return dict(result, node=host, msg=msgs.group_node_failed(
                    self.name, host, self.rank(host), answer.get("msg"), self.head_host, result.get("msg")))
        missing = [(host, self.rank(host), _where(seen.get(host))) for host in self.followers
                   if (seen.get(host) or {}).get("verdict") != "pass"]
        # a head that timed out, or that SGLang ended when --dist-timeout ran out, waited for these ranks
        if result.get("verdict") in ("timeout", "died", "crash_loop") and missing:
            return dict(result, node=missing[0][0], msg=msgs.group_not_joined(
                self.name, self.head_host, missing, result.get("msg")))
        message = msgs.group_head_failed(self.name, self.head_host, result.get("msg"))
        return dict(result, node=self.head_host, msg=message)

    # ------------------------------------------------------------------ last-known-good, revert

    def save_last_good(self, verified):
        """Keep every node's unit as last-known-good, each with its own verification: the head's (saved, error)."""
        nodes = verified.get("nodes") or {}
        for host in self.hosts:
            self.saved[host] = self.paths[host].save_last_good(nodes.get(host) or {})
        errors = ["%s: %s" % (host, error) for host, (saved, error) in self.saved.items() if error]
        return self.saved[self.head_host][0], "; ".join(errors) or None

    def revert(self):
        """Every node's last-known-good files back, the group restarted as in apply and verified against what was
        recorded with them (never raises): _records.revert_outcome's shape (the head's), every node's under
        ``nodes``."""
        self.say("serving group %s: reverting every node to its last-known-good unit" % self.name)
        before, restored = {}, {}
        for host in self.hosts:
            before[host], restored[host] = self.paths[host].restore_last_good()
        waits, restart = {}, {}
        unrestored = [host for host in self.hosts if restored[host].get("failed")]
        if not unrestored:
            try:
                previous = self.restart(running=before)
                args = dict((host, self.paths[host].reverted_wait_args(restored[host], previous[host],
                                                                       follower=host != self.head_host))
                            for host in self.hosts)
                waits = self.wait(args, step=hp.REVERT)
            except hp.StepFailed as failed:
                failure = dict(failed.result, failed=True)
                if failed.step in (hp.STOP, hp.START_NODE):
                    restart = failure  # the group could not be restarted with the restored files
                else:
                    waits = dict((host, failure) for host in self.hosts)
        nodes = dict((host, _records.revert_outcome([restored[host], restart, waits.get(host) or {}]))
                     for host in self.hosts)
        outcome = dict(nodes[self.head_host], nodes=nodes, group=self.name)
        outcome["healthy"] = all(item["healthy"] for item in nodes.values())
        if unrestored:
            outcome.update(verdict="not_restored", msg="serving group %s: the last-known-good files of %s could not "
                           "be put back (%s), so the group was not restarted" % (
                               self.name, ", ".join(unrestored), nodes[unrestored[0]].get("msg")))
        return outcome


def _where(answer):
    """Where a follower's wait stands, in words (its phase and its unit's state)."""
    answer = answer or {}
    state = answer.get("unit_state") or {}
    unit = "%s/%s" % (state.get("active_state"), state.get("sub_state")) if state.get("active_state") else None
    phase = answer.get("phase") or "its wait did not report"
    return "%s (unit %s)" % (phase, unit) if unit else phase
