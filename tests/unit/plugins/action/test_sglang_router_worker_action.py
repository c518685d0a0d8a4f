# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_router_worker's action plugin: the module's logic in-process on the controller."""
import fakes
from ansible_collections.gpufleet.inference.plugins.action import sglang_router_worker as action_mod
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterError

ARGS = {"router_url": "http://r:30080", "worker_url": "http://w:30000", "state": "absent"}


def test_runs_the_module_logic_with_validated_params(monkeypatch):
    seen = {}

    def run(params, check_mode):
        seen.update(params=params, check_mode=check_mode)
        return {"changed": True, "workers": [], "diff": {"before": "x\n", "after": ""}}
    monkeypatch.setattr(action_mod, "worker_change", run)
    result = fakes.make_action(action_mod, dict(ARGS), check_mode=True).run(task_vars={})
    assert result["changed"] is True and "diff" not in result  # no --diff
    assert seen["check_mode"] is True and seen["params"]["drain_timeout"] == 600  # the module's defaults apply
    with_diff = fakes.make_action(action_mod, dict(ARGS), diff=True).run(task_vars={})
    assert with_diff["diff"] == {"before": "x\n", "after": ""}


def test_router_errors_fail_the_task(monkeypatch):
    def run(params, check_mode):
        raise RouterError("listing the router's workers at http://r:30080/workers: connection refused")
    monkeypatch.setattr(action_mod, "worker_change", run)
    result = fakes.make_action(action_mod, dict(ARGS)).run(task_vars={})
    assert result["failed"] and result["changed"] is False and "connection refused" in result["msg"]


def refuse_to_run(params, check_mode):
    raise AssertionError("called with %r (check_mode=%r)" % (params, check_mode))


def test_bad_arguments_are_refused_before_any_call(monkeypatch):
    import pytest
    from ansible.errors import AnsibleActionFail
    monkeypatch.setattr(action_mod, "worker_change", refuse_to_run)
    with pytest.raises(AnsibleActionFail, match="worker_url"):
        fakes.make_action(action_mod, {"router_url": "http://r", "state": "absent"}).run(task_vars={})
