# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ansible.builtin.linear without its busy wait for a free worker.

When every fork is busy (more hosts in a task than `forks`: the rollout's prepare phase runs every
host of the rollout at once), ansible.builtin.linear's StrategyBase._queue_task loops over its
workers' is_alive() with 0.1 ms sleeps until one ends: ~0.2 s of the controller's CPU per second
of waiting (measured here: 3,900 rounds a second over 10 workers), for as long as the slowest
comparison of a wave takes (seconds, when SGLang's import is part of it). This strategy waits for
the first worker to END instead, on the workers' process sentinels (the kernel wakes it), then
hands over to linear's own queueing, which finds the free slot at once.

It also waits for a task's results without polling: ansible.builtin's StrategyBase wakes every
internal_poll_interval to look for results (~0.2 ms of CPU a round: 9 ms of controller CPU per
second at 0.02 s, for as long as a batch waits for its model loads). Here the thread that receives
the workers' results wakes the wait when one arrives. Everything else is linear.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: linear
short_description: ansible.builtin.linear, waiting for a free worker and for results without polling
description:
  - Runs a play exactly as C(ansible.builtin.linear) does (lockstep per batch, C(serial), C(forks)).
  - When every worker is busy, a task for the next host waits until one of them ends, woken by the
    kernel, instead of polling every worker after 0.1 ms sleeps (about 4,000 rounds a second,
    measured). This saves the controller's CPU when a task runs on more hosts than C(forks) (the
    rollout's prepare phase runs on all hosts).
  - While a task runs, it waits for the workers' results without polling - woken when a result
    arrives, instead of waking every C(internal_poll_interval) (measured 1.5 ms of controller CPU
    per second of waiting at 0.1 s, 9 ms at 0.02 s, 42 ms at Ansible's default 0.001 s; here 0.8 ms,
    and a result is seen at once). A rollout mostly waits for model loads.
  - A task with C(throttle) is queued by C(ansible.builtin.linear) unchanged.
author:
  - gpufleet maintainers (@gpufleet)
notes:
  - Opt in - the playbooks gpufleet.inference.rollout and gpufleet.inference.verify use it with
    C(-e rollout_strategy=gpufleet.inference.linear) (C(verify_strategy) for verify); their default
    is the strategy of your ansible.cfg.
  - ansible-core 2.19 deprecates strategy plugins outside ansible.builtin (a warning at each play,
    no removal version set); that is why it is not the playbooks' default.
"""

import threading
from collections import deque
from multiprocessing.connection import wait as wait_for_sentinels

from ansible.errors import AnsibleError

from ansible.plugins.strategy.linear import StrategyModule as LinearStrategyModule

# Upper bound of one sleep while every worker is busy: a worker that ends wakes the wait at once;
# the bound only limits how long a missed wake-up (none is expected) could delay the next host.
MAX_WAIT_SECONDS = 1.0


def busy_sentinels(workers):
    """The sentinels of the workers still running, or None when a slot is free (empty or ended)."""
    sentinels = []
    for worker in workers:
        if worker is None or not worker.is_alive():
            return None
        sentinels.append(worker.sentinel)
    return sentinels


def wait_for_a_free_worker(workers, timeout=MAX_WAIT_SECONDS):
    """Block until a slot of `workers` is free (no polling: the first worker to end wakes it)."""
    while True:
        try:
            sentinels = busy_sentinels(workers)
            if not sentinels:
                return
            wait_for_sentinels(sentinels, timeout)
        except (OSError, ValueError):  # a closed worker: let linear's own loop decide
            return


class ResultsQueue(deque):
    """The strategy's queue of received results: an append (by Ansible's results thread, under the
    strategy's results lock) also sets ``arrived``, which wakes a wait for results."""

    def __init__(self, *args, **kwargs):
        super(ResultsQueue, self).__init__(*args, **kwargs)
        self.arrived = threading.Event()

    def append(self, x):
        super(ResultsQueue, self).append(x)
        self.arrived.set()


class StrategyModule(LinearStrategyModule):
    def __init__(self, tqm):
        super(StrategyModule, self).__init__(tqm)
        with self._results_lock:  # the results thread runs already; nothing is queued yet
            self._results = ResultsQueue(self._results)

    def _wait_on_pending_results(self, iterator):
        """StrategyBase._wait_on_pending_results, asleep until a result arrives instead of polling every
        internal_poll_interval (a worker that dies is still noticed within MAX_WAIT_SECONDS)."""
        results = []
        arrived = self._results.arrived
        while self._pending_results > 0 and not self._tqm._terminated:
            if self._tqm.has_dead_workers():
                raise AnsibleError("A worker was found in a dead state")
            arrived.clear()  # before reading: a result appended from here on wakes the wait below
            results.extend(self._process_pending_results(iterator))
            if self._pending_results > 0:
                arrived.wait(MAX_WAIT_SECONDS)
        return results

    def _queue_task(self, host, task, task_vars, play_context):
        if not task.throttle:  # throttle limits the slots linear looks at; leave that to it
            wait_for_a_free_worker(self._workers)
        return super(StrategyModule, self)._queue_task(host, task, task_vars, play_context)
