# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's steps through its action (the host path with Ansible's module execution): what each state
runs, what it returns, and which facts it sets. The host's modules are scripted."""
import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.inference.plugins.action import sglang_host as action_mod
from ansible_collections.gpufleet.inference.plugins.module_utils import _hostpath as hp
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _slices

import fakes
from fakes import NEW, OLD

UNIT = "/etc/systemd/system/sglang.service"
SETTINGS = {"sglang_unit_name": "sglang.service", "sglang_api_key": "", "sglang_user": "root", "sglang_group": "root",
            "sglang_ready_timeout": 600, "sglang_min_ready_seconds": 10, "sglang_accept_unverified": False,
            "sglang_probe_prompt": "p", "sglang_probe_max_new_tokens": 8, "sglang_journal_grace": 35,
            "sglang_receipt_dir": "/r", "sglang_last_good_dir": "/lg", "sglang_progress": False,
            "sglang_verify": True, "sglang_fleet_dir": "/fleet", "sglang_lease_seconds": 300,
            "sglang_ready_connection_retry_seconds": 120}
PREPARED = {"version": "0.5.23", "intent": {"expect": {"draft_window_size": 2048}, "config_line": "required"},
            "unit_text": "[Unit]\n", "journald_text": "[Journal]\n",
            "paths": {"unit": UNIT, "journald": "/etc/systemd/journald.conf.d/50-gpufleet-sglang.conf"},
            "unit_files": [UNIT], "config_file": None,
            "endpoint": {"url": "http://127.0.0.1:30000", "worker_url": "http://gpu-1:30000"}}
PASS = {"verdict": "pass", "verified": True, "invocation_id": NEW, "observed": {"draft_window_size": 2048},
        "source": "journal", "msg": "serving"}


class Host(object):
    def __init__(self, **answers):
        self.answers = dict((name, list(items)) for name, items in answers.items())
        self.calls = []
        self.leases = []  # the lease's calls, kept apart from the steps'
        self.carried = []  # (module, its lease option): the steps recorded by the step's own module

    def __call__(self, module_name, module_args, task_vars):
        short = module_name.rsplit(".", 1)[-1]
        if short == "sglang_lease":
            self.leases.append(dict(module_args))
            queue = self.answers.get(short) or [{"changed": True, "lease": {"generation": len(self.leases)}}]
            return dict(queue.pop(0) if len(queue) > 1 else queue[0])
        args = dict(module_args)
        carried = args.pop("lease", None)  # a step's module that renews the lease and records the step itself
        self.calls.append((short, args))
        queue = self.answers.get(short) or [{"changed": False}]
        answer = dict(queue.pop(0) if len(queue) > 1 else queue[0])
        if carried:
            self.carried.append((short, carried))
            answer.setdefault("lease", {"generation": carried["holder"]["generation"]})
        return answer

    def names(self):
        return [name for name, dummy in self.calls]


def drift(**changes):
    base = {"verdict": "drifted", "in_sync": False, "invocation_id": OLD, "active_state": "active", "enabled": True,
            "restart_pending": False, "changed_files": [UNIT], "missing_accounts": [], "blocking": [],
            "last_good": {"exists": True}, "receipt": None, "prepared": PREPARED}
    base.update(changes)
    return base


def act(host, state, the_drift=None, check_mode=False, **task_vars):
    action = fakes.make_action(action_mod, {"state": state}, check_mode=check_mode,
                               action="gpufleet.inference.sglang_host")
    action._execute_module = host
    variables = dict(SETTINGS, inventory_hostname="gpu-1", sglang_drift=the_drift or drift())
    variables.update(task_vars)
    return action.run(task_vars=variables)


def test_installed_is_changed_when_a_restart_is_due_and_restarts_nothing():
    host = Host(sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "restarted": False}])
    result = act(host, "installed")
    assert result["changed"] is True and result["restart_due"] is True and result["changed_files"] == [UNIT]
    assert host.names() == ["sglang_unit_files"] and "restart" not in host.calls[0][1]
    # nothing differs and the process runs the installed unit: not changed, the handler is not notified
    host = Host()
    result = act(host, "installed", drift(changed_files=[]))
    assert result["changed"] is False and host.calls == [] and result["msg"] == "nothing to install"


def test_installed_keeps_what_runs_before_the_first_change_and_a_pending_restart_is_due():
    host = Host(sglang_last_good=[{"changed": True, "exists": True}])
    result = act(host, "installed", drift(changed_files=[], restart_pending=True, last_good={"exists": False},
                                          restart_reasons=["the process does not run the installed unit"]))
    assert host.names() == ["sglang_last_good"] and host.calls[0][1]["from_process"] is True
    assert result["changed"] is True and result["restart_due"] is True
    assert result["msg"] == "the process does not run the installed unit"


def test_restarted_is_the_handler_restart_wait_and_keep(monkeypatch):
    waits = []
    monkeypatch.setattr(_slices, "wait_in_slices", lambda execute, reset, args, host, check_mode=False, between=None:
                        waits.append(args) or dict(PASS))
    host = Host(sglang_unit_files=[{"changed": True, "restarted": True, "status": {"InvocationID": OLD}}],
                sglang_last_good=[{"changed": True, "exists": True}])
    result = act(host, "restarted")
    assert host.names() == ["sglang_unit_files", "sglang_last_good"]
    assert host.calls[0][1] == {"restart": {"unit": "sglang.service", "force": True}}
    assert waits[0]["after_invocation"] == OLD and waits[0]["unit"] == "sglang.service"
    assert result["verdict"] == "pass" and result["last_good_saved"] is True and result["changed"] is True
    assert result["ansible_facts"]["sglang_verified"]["invocation_id"] == NEW


def test_the_handlers_restart_records_its_step_in_the_same_module_run_under_the_roles_lease(monkeypatch):
    monkeypatch.setattr(_slices, "wait_in_slices", lambda *a, **k: dict(PASS))
    host = Host(sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "restarted": False}])
    installed = act(host, "installed")  # the role's own lease, taken before its first change
    holder = installed["ansible_facts"]["sglang_lease_holder"]
    assert [args["record"]["step"] for args in host.leases] == ["applying"] and holder["generation"] == 1
    host = Host(sglang_unit_files=[{"changed": True, "restarted": True, "status": {"InvocationID": OLD}}],
                sglang_last_good=[{"changed": True, "exists": True}])
    act(host, "restarted", sglang_lease_holder=holder)
    assert host.leases == [] and [(name, args["record"]["step"]) for name, args in host.carried] == [
        ("sglang_unit_files", "restarting")]
    assert host.carried[0][1]["holder"]["generation"] == 1
    # the lease taken over meanwhile: the restart is refused before it restarts anything, and the step says so
    refused = {"failed": True, "action": "refused", "changed": False, "msg": "sglang.service: this run's lease of the "
               "host was taken over: it is now held by sweep sw-2. Nothing was changed."}
    host = Host(sglang_unit_files=[refused])
    out = act(host, "restarted", sglang_lease_holder=holder)
    assert out["failed"] and out["failed_step"] == hp.HOLD and "sweep sw-2" in out["msg"] and not out["changed"]
    assert host.names() == ["sglang_unit_files"]


def test_a_failed_wait_fails_the_handler_with_the_waits_verdict_and_keeps_nothing(monkeypatch):
    failing = {"failed": True, "verdict": "mismatch", "msg": "logged 1024"}
    monkeypatch.setattr(_slices, "wait_in_slices", lambda *a, **k: dict(failing))
    host = Host(sglang_unit_files=[{"changed": True, "restarted": True, "status": {}}])
    result = act(host, "restarted")
    assert result["failed"] and result["verdict"] == "mismatch" and result["failed_step"] == hp.WAIT
    assert "logged 1024" in result["msg"] and host.names() == ["sglang_unit_files"]


def test_verified_reuses_the_handlers_verification_else_checks_the_running_process(monkeypatch):
    host = Host()
    result = act(host, "verified", sglang_verified=dict(PASS))
    assert result["verdict"] == "pass" and host.calls == [] and result["changed"] is False
    monkeypatch.setattr(_slices, "wait_in_slices", lambda *a, **k: dict(PASS, invocation_id=OLD))
    result = act(Host(), "verified", drift(changed_files=[]), sglang_verified={})
    assert result["invocation_id"] == OLD and result["ansible_facts"]["sglang_verified"]["invocation_id"] == OLD


def test_verified_starts_a_unit_that_is_not_running_and_keeps_it(monkeypatch):
    monkeypatch.setattr(_slices, "wait_in_slices", lambda *a, **k: dict(PASS))
    host = Host(systemd_service=[{"changed": True, "status": {}}], sglang_last_good=[{"changed": True, "exists": True}])
    result = act(host, "verified", drift(changed_files=[], active_state="inactive", invocation_id=None))
    assert host.names() == ["systemd_service", "sglang_last_good"] and result["last_good_saved"] is True


def test_saving_an_unverified_unit_is_refused_and_a_revert_sets_its_fact(monkeypatch):
    result = act(Host(), "last_good_saved", sglang_verified={"verdict": "not_verified", "msg": "sglang_verify is off"})
    assert result["failed"] and "not verified (sglang_verify is off)" in result["msg"]
    monkeypatch.setattr(_slices, "wait_in_slices", lambda *a, **k: dict(PASS, invocation_id="cccc"))
    host = Host(sglang_info=[{"invocation_id": NEW}], sglang_last_good=[{"changed": True, "record": {"intent": {}}}],
                systemd_service=[{"changed": True}])
    result = act(host, "reverted")
    assert result["revert"]["healthy"] and result["ansible_facts"]["sglang_revert"]["invocation_id"] == "cccc"


def test_outside_the_role_or_without_its_drift_check_it_refuses():
    action = fakes.make_action(action_mod, {"state": "installed"}, action="gpufleet.inference.sglang_host")
    with pytest.raises(AnsibleActionFail, match="inside the role"):
        action.run(task_vars={"inventory_hostname": "gpu-1"})
    with pytest.raises(AnsibleActionFail, match="sglang_drift"):
        action.run(task_vars=dict(SETTINGS, inventory_hostname="gpu-1"))
    with pytest.raises(AnsibleActionFail, match="state must be one of"):
        fakes.make_action(action_mod, {"state": "bogus"}).run(task_vars={})


def test_check_mode_runs_the_install_in_check_mode_with_its_diff_and_skips_the_restart():
    diff = [{"before_header": UNIT, "after_header": UNIT, "before": '"2048"\n', "after": '"4096"\n'}]
    host = Host(sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "diff": diff}])
    result = act(host, "installed", check_mode=True)
    # the modules run (Ansible runs them in check mode: they write nothing) and their diff is shown
    assert host.names() == ["sglang_unit_files"] and result["diff"] == diff
    assert result["changed"] is True and result["restart_due"] is True
    result = act(Host(), "restarted", check_mode=True)
    assert result["skipped"] and result["changed"] is True and "changes nothing" in result["msg"]


def test_a_sweep_leases_the_host_the_role_steps_renew_its_lease_and_release_only_their_own(monkeypatch):
    host = Host()
    taken = act(host, "leased")
    holder = taken["ansible_facts"]["sglang_lease_holder"]
    assert taken["changed"] and holder["kind"] == "sweep" and holder["generation"] == 1
    assert host.leases[0]["record"]["step"] == "started" and host.leases[0]["holder"]["kind"] == "sweep"
    # a combination's install renews the sweep's lease and does not release it
    host = Host(sglang_unit_files=[{"changed": True, "changed_files": [UNIT]}])
    out = act(host, "installed", sglang_lease_holder=holder)
    assert host.leases == [] and [(name, args["holder"]["session"], args["record"]["step"])
                                  for name, args in host.carried] == [("sglang_unit_files", holder["session"], "applying")]
    assert out["ansible_facts"]["sglang_lease_holder"]["generation"] == 1
    # the end of the sweep releases it; a role step after it takes (and releases) a lease of its own
    host = Host()
    released = act(host, "released", sglang_lease_holder=holder)
    assert host.leases[0]["state"] == "released" and released["ansible_facts"]["sglang_lease_holder"]["generation"] \
        is None
    host = Host(sglang_unit_files=[{"changed": True, "changed_files": [UNIT]}])
    act(host, "installed", sglang_lease_holder=released["ansible_facts"]["sglang_lease_holder"])
    assert host.leases[0]["holder"]["kind"] == "role"


def test_the_roles_own_lease_is_released_when_its_step_is_done(monkeypatch):
    monkeypatch.setattr(_slices, "wait_in_slices", lambda *a, **k: dict(PASS))
    host = Host()
    act(host, "verified", drift(changed_files=[]), sglang_verified={})
    assert [args["state"] for args in host.leases] == []  # verifying the running process changes nothing
    host = Host(systemd_service=[{"changed": True, "status": {}}], sglang_last_good=[{"changed": True, "exists": True}])
    act(host, "verified", drift(changed_files=[], active_state="inactive", invocation_id=None))
    assert [args["state"] for args in host.leases] == ["held", "released"]
    assert host.leases[0]["holder"]["kind"] == "role" and host.leases[1]["record"]["status"] == "started"


def test_reset_forgets_an_earlier_verification_as_a_fact_and_touches_nothing():
    host = Host()
    result = act(host, "reset", sglang_verified=dict(PASS))
    assert result["ansible_facts"] == {"sglang_verified": {}} and host.calls == [] and host.leases == []


GROUP = {"name": "k26_2node", "head": "gpu-1", "followers": ["gpu-2"], "rank": 0}


def test_a_group_node_that_must_change_without_its_other_nodes_in_the_play_changes_nothing():
    host = Host()
    result = act(host, "installed", drift(prepared=dict(PREPARED, group=GROUP)), ansible_play_hosts_all=["gpu-1"])
    assert result["failed"] and host.calls == [] and host.leases == []
    assert result["msg"] == ("gpu-1: Install the SGLang unit and config file (what differs): gpu-1 must change, and it "
                             "is a node of serving group k26_2node, whose nodes restart together: gpu-2 is not in this "
                             "play. Include every node of the group (or roll it out with gpufleet.inference.rollout). "
                             "Nothing changed.")


def test_a_group_node_with_its_whole_group_in_the_play_or_in_sync_goes_on():
    host = Host(sglang_unit_files=[{"changed": True, "changed_files": [UNIT]}])
    grouped = drift(prepared=dict(PREPARED, group=GROUP))
    assert act(host, "installed", grouped, ansible_play_hosts_all=["gpu-1", "gpu-2"])["restart_due"] is True
    in_sync = drift(changed_files=[], prepared=dict(PREPARED, group=GROUP))
    assert not act(Host(), "installed", in_sync, ansible_play_hosts_all=["gpu-1"]).get("failed")
