# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""collector_paused: the collector is off inside, back as it was after (also after an exception)."""
import gc

import pytest

from ansible_collections.gpufleet.inference.plugins.plugin_utils._builds import collector_paused


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_and_on_again_after(collector):
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_on_again_after_an_exception(collector):
    gc.enable()
    with pytest.raises(RuntimeError):
        with collector_paused():
            raise RuntimeError("a build failed")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(collector):
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_the_prebuild_builds_with_the_collector_paused(collector):
    from ansible_collections.gpufleet.inference.plugins.action import sglang_rollout

    import fakes
    action = fakes.make_action(sglang_rollout, {"state": "prepared"})
    seen = []
    action._configure_module = lambda name, args, task_vars: seen.append((name, gc.isenabled()))
    gc.enable()
    assert action._prebuild({}) == list(sglang_rollout.CRITICAL_PATH_MODULES)
    assert seen == [(name, False) for name in sglang_rollout.CRITICAL_PATH_MODULES] and gc.isenabled()
