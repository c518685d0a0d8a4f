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
