# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.inference.linear: a task waits for a free worker on the workers' sentinels, not by polling.

Workers here are real: child processes (their sentinels are what Ansible's WorkerProcess has), or a
fake whose sentinel is a pipe the test closes, so a poll would show as is_alive() calls."""
import multiprocessing
import os
import threading
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.strategy import linear as strategy


def sleeper(seconds):
    time.sleep(seconds)


@pytest.fixture
def processes():
    started = []

    def start(seconds):
        proc = multiprocessing.get_context("fork").Process(target=sleeper, args=(seconds,))
        proc.start()
        started.append(proc)
        return proc
    yield start
    for proc in started:
        proc.kill()
        proc.join()


class PipeWorker(object):
    """A worker that ends when the test says so; counts how often it is asked whether it runs."""

    def __init__(self):
        self.sentinel, self._write = os.pipe()
        self.alive = True
        self.asked = 0
        self._open = True

    def is_alive(self):
        self.asked += 1
        return self.alive

    def end(self):
        self.alive = False
        os.close(self._write)  # the read end becomes readable (EOF): what a process's sentinel does
        self._open = False

    def close(self):
        os.close(self.sentinel)
        if self._open:
            os.close(self._write)


def test_a_free_slot_is_seen_without_waiting(processes):
    running = processes(30)
    assert strategy.busy_sentinels([running, None]) is None  # a slot never used
    ended = processes(0)
    ended.join()
    assert strategy.busy_sentinels([running, ended]) is None  # a worker that ended
    assert strategy.busy_sentinels([running]) == [running.sentinel]
    started = time.monotonic()
    strategy.wait_for_a_free_worker([running, None])
    assert time.monotonic() - started < 0.5
    assert running.is_alive()


def test_waits_until_the_first_worker_ends_and_no_longer(processes):
    short, long_ = processes(0.3), processes(30)
    strategy.wait_for_a_free_worker([long_, short])
    assert not short.is_alive()  # not before a worker ended
    assert long_.is_alive()      # and not for all of them


def test_the_wait_does_not_poll_the_workers():
    workers = [PipeWorker(), PipeWorker(), PipeWorker()]
    try:
        timer = threading.Timer(0.5, workers[1].end)
        timer.start()
        strategy.wait_for_a_free_worker(workers, timeout=5.0)
        timer.join()
        assert not workers[1].alive
        # linear's own loop asks ~4,000 times a second; this one once per wake-up (start, end)
        assert max(worker.asked for worker in workers) <= 3
    finally:
        for worker in workers:
            worker.close()


def test_a_missed_wake_up_costs_at_most_the_timeout():
    workers = [PipeWorker()]
    try:
        def end_quietly():  # ends without waking the sentinel
            workers[0].alive = False
        timer = threading.Timer(0.2, end_quietly)
        timer.start()
        started = time.monotonic()
        strategy.wait_for_a_free_worker(workers, timeout=0.5)
        timer.join()
        assert 0.2 <= time.monotonic() - started < 3.0
    finally:
        workers[0].close()


def test_a_closed_worker_hands_over_to_linear():
    class Closed(object):
        def is_alive(self):
            return True

        @property
        def sentinel(self):
            raise ValueError("process object is closed")
    strategy.wait_for_a_free_worker([Closed()])  # returns; linear's loop decides


class FakeTask(object):
    def __init__(self, throttle=0):
        self.throttle = throttle


@pytest.mark.parametrize("throttle, waits", [(0, True), (2, False), ("{{ limit }}", False)])
def test_queue_task_waits_first_then_queues_as_linear(monkeypatch, throttle, waits):
    calls = []
    monkeypatch.setattr(strategy, "wait_for_a_free_worker", lambda workers: calls.append(("wait", workers)))
    monkeypatch.setattr(strategy.LinearStrategyModule, "_queue_task",
                        lambda self, host, task, task_vars, play_context: calls.append(("queue", host)))
    module = object.__new__(strategy.StrategyModule)
    module._workers = ["w1", "w2"]
    module._queue_task("gpu-1", FakeTask(throttle), {}, None)
    expected = ([("wait", ["w1", "w2"])] if waits else []) + [("queue", "gpu-1")]
    assert calls == expected


# --------------------------------------------------------------------------- waiting for results

class FakeTqm(object):
    def __init__(self, dead=False):
        self._terminated = False
        self.dead = dead

    def has_dead_workers(self):
        return self.dead


class Waiter(object):
    """What StrategyModule._wait_on_pending_results uses of the strategy: a pending count, the results
    queue the results thread appends to, and _process_pending_results (counted: a poll shows as calls)."""

    _wait_on_pending_results = strategy.StrategyModule._wait_on_pending_results

    def __init__(self, pending, dead=False):
        self._pending_results = pending
        self._results = strategy.ResultsQueue()
        self._tqm = FakeTqm(dead)
        self.passes = 0

    def _process_pending_results(self, iterator):
        self.passes += 1
        done = []
        while self._results:
            done.append(self._results.popleft())
            self._pending_results -= 1
        return done


def deliver(waiter, items, delay):
    """What Ansible's results thread does, `delay` seconds from now: append each result."""
    def run():
        for item in items:
            time.sleep(delay)
            waiter._results.append(item)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_results_queue_wakes_a_wait_when_a_result_arrives():
    queue = strategy.ResultsQueue(["kept"])
    assert list(queue) == ["kept"] and not queue.arrived.is_set()
    queue.append("new")
    assert queue.arrived.is_set() and list(queue) == ["kept", "new"]


def test_the_wait_for_results_sleeps_until_one_arrives_and_returns_every_result():
    waiter = Waiter(pending=2)
    started = time.monotonic()
    thread = deliver(waiter, ["r1", "r2"], 0.3)
    results = waiter._wait_on_pending_results(None)
    elapsed = time.monotonic() - started
    thread.join()
    assert results == ["r1", "r2"] and waiter._pending_results == 0
    assert 0.55 <= elapsed < 0.9  # woken by each result, not by the 1 s bound
    # ansible.builtin polls every internal_poll_interval (30 passes in 0.6 s at 0.02): here one pass a
    # result, plus the first (and one more if a result lands while a pass runs)
    assert waiter.passes <= 5, waiter.passes


def test_a_result_that_arrives_before_the_wait_is_not_missed():
    waiter = Waiter(pending=1)
    waiter._results.append("early")  # arrived while the strategy was queueing tasks
    started = time.monotonic()
    assert waiter._wait_on_pending_results(None) == ["early"]
    assert time.monotonic() - started < 0.2 and waiter.passes == 1


def test_a_missed_wake_up_of_the_results_wait_costs_at_most_the_bound(monkeypatch):
    monkeypatch.setattr(strategy, "MAX_WAIT_SECONDS", 0.2)
    waiter = Waiter(pending=1)

    def late():  # lands after the first pass; deque.extend does not set the event: no wake-up comes
        time.sleep(0.05)
        waiter._results.extend(["silent"])
    thread = threading.Thread(target=late)
    thread.start()
    started = time.monotonic()
    assert waiter._wait_on_pending_results(None) == ["silent"]
    thread.join()
    assert 0.15 <= time.monotonic() - started < 0.6


def test_a_dead_worker_fails_the_wait_for_results():
    from ansible.errors import AnsibleError
    waiter = Waiter(pending=1, dead=True)
    with pytest.raises(AnsibleError, match="dead state"):
        waiter._wait_on_pending_results(None)
