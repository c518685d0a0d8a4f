# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One host of a rollout's apply phase in one action: the order of its steps, what each failure
leaves (revert, router, record), and that nothing is done that the host did not need.

The host's modules (``_execute_module``) and the router are scripted; the records are real files."""
import copy
import json

import pytest

from ansible.errors import AnsibleConnectionFailure

from ansible_collections.gpufleet.inference.plugins.action import sglang_rollout_host as action_mod
from ansible_collections.gpufleet.inference.plugins.module_utils import _hostpath as hp
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _slices as ready_mod
from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro

import fakes
from fakes import NEW, OLD

HOST = "gpu-1"
UNIT_PATH = "/etc/systemd/system/sglang.service"
INTENT = {"expect": {"draft_window_size": 2048}, "config_line": "required", "command": ["python3", "-m", "sglang"],
          "environment": {}}
# sglang_unit_files with restart: the unit written, then reloaded, enabled and restarted in the same run.
INSTALLED = {"changed": True, "changed_files": [UNIT_PATH], "restarted": True, "status": {"InvocationID": OLD}}
PASS = {"verdict": "pass", "verified": True, "invocation_id": NEW, "observed": {"draft_window_size": 2048},
        "source": "journal", "phases": {"generate": {"elapsed": 7.5}}, "msg": "invocation %s is serving" % NEW}


@pytest.fixture
def shown(monkeypatch):
    fake = fakes.Display()
    monkeypatch.setattr(ready_mod, "display", fake)
    monkeypatch.setattr(action_mod.time, "sleep", lambda seconds: None)
    return fake


class Router(object):
    """sglang_router_worker.run: answers per state in order (a dict, or an exception to raise)."""

    def __init__(self, **answers):
        self.answers = dict((state, list(items)) for state, items in answers.items())
        self.calls = []

    def __call__(self, params, check_mode):
        self.calls.append(params["state"])
        queue = self.answers.get(params["state"]) or [{}]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return dict({"changed": True, "workers": [], "drain_seconds": 0.4}, **answer)


class Host(object):
    """_execute_module: answers per module name in order (a dict, or an exception to raise)."""

    def __init__(self, **answers):
        self.answers = dict((name, list(items)) for name, items in answers.items())
        self.calls = []
        self.leases = []
        self.written = []  # (the step written on the host, the module that wrote it), in order
        self.records = []  # what each of them wrote into the host's record (None: a renewal only)

    def __call__(self, module_name, module_args, task_vars):
        short = module_name.rsplit(".", 1)[-1]
        args = copy.deepcopy(dict(module_args))
        # the lease's renewals (each step written on the host first) are kept apart from the steps' modules;
        # a step's module that carries the lease (its `lease` option) keeps it apart too
        carried = args.pop("lease", None) if short != "sglang_lease" else None
        (self.leases if short == "sglang_lease" else self.calls).append((short, args))
        default = {"changed": True, "lease": {"generation": 7}} if short == "sglang_lease" else {"changed": False}
        queue = self.answers.get(short) or [default]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        answer = dict(answer)
        lease = args if short == "sglang_lease" else carried
        # (an answer with lease None: the module failed before it held the lease)
        if lease and answer.get("action") != "refused" and not answer.get("unreachable") and \
                not ("lease" in answer and answer["lease"] is None):
            # as the module does: the lease renewed and the step recorded before anything else
            self.written.append(((lease.get("record") or {}).get("step"), short))
            self.records.append(lease.get("record"))
            if carried:
                answer.setdefault("lease", {"generation": 7})
        return answer

    def names(self):
        return [name for name, dummy in self.calls]

    def holds(self):
        """The steps written on the host, in order (each with the lease renewed), by their own lease run or
        carried by the step's module."""
        return [step for step, dummy in self.written]


def drift(**changes):
    base = {"host": HOST, "verdict": "drift", "in_sync": False, "invocation_id": OLD, "active_state": "active",
            "enabled": True, "restart_pending": False, "changed_files": [UNIT_PATH], "missing_accounts": [],
            "blocking": [], "last_good": {"exists": True}, "receipt": None, "observed": {"draft_window_size": 1024}}
    base.update(changes)
    return base


def start_run(tmp_path):
    run = {"run_id": "r1", "run_dir": str(tmp_path / "r1"), "check_mode": False, "fleet": {}}
    ro.record_step(run, HOST, "prepared", {"drift": drift(), "router": True})
    return run


# The role's variables the host path reads (their defaults, and this lab's values).
SETTINGS = {"sglang_unit_name": "sglang.service", "sglang_api_key": "", "sglang_user": "root", "sglang_group": "root",
            "sglang_ready_timeout": 600, "sglang_min_ready_seconds": 10, "sglang_accept_unverified": False,
            "sglang_probe_prompt": "The capital of France is", "sglang_probe_max_new_tokens": 16,
            "sglang_journal_grace": 35, "sglang_receipt_dir": "/var/lib/gpufleet-inference/receipts",
            "sglang_last_good_dir": "/var/lib/lg", "sglang_progress": True, "sglang_verify": True,
            "sglang_fleet_dir": "/var/lib/gpufleet-inference/fleet", "sglang_lease_seconds": 300,
            "sglang_ready_connection_retry_seconds": 120}
PREPARED = {"version": "0.5.11", "intent": INTENT, "unit_text": "[Service]\n", "journald_text": "[Journal]\n",
            "paths": {"unit": UNIT_PATH, "journald": "/etc/systemd/journald.conf.d/50-gpufleet-sglang.conf"},
            "unit_files": [UNIT_PATH], "config_file": None,
            "endpoint": {"url": "http://gpu-1:30000", "worker_url": "http://gpu-1:30000"}}


HOLDER = {"kind": "rollout", "run_id": "r1", "session": "s1", "controller": "c", "user": "u", "job": None}


def act(tmp_path, host, router, the_drift=None, router_url="http://router:30080", monkeypatch=None, listed=False,
        settings=None, prepared=None, drain_url="http://gpu-1:30000", analysis=None, hostvars=None, **extra):
    run = dict(start_run(tmp_path), holder=HOLDER, digests={HOST: "d1"}, analysis=analysis or {})
    args = dict(run=run, lease={"lease": {"generation": 7}}, plan={"drain_url": drain_url if router_url else None},
                router={"url": router_url, "worker_url": "http://gpu-1:30000", "rejoin_retries": 1})
    args.update(extra)
    action = fakes.make_action(action_mod, args, action="gpufleet.inference.sglang_rollout_host")
    action._execute_module = host
    monkeypatch.setattr(action_mod, "worker_change", router)
    # After a failed drain: does the router still list the worker (GET /workers)?
    monkeypatch.setattr(action_mod.ActionModule, "_still_listed", lambda self: listed)
    the_drift = the_drift or drift()
    the_drift = dict(the_drift, prepared=dict(PREPARED, **dict(the_drift.get("prepared") or {}, **(prepared or {}))))
    task_vars = dict(SETTINGS, **(settings or {}))
    task_vars.update(inventory_hostname=HOST, sglang_drift=the_drift, hostvars=hostvars or {})
    result = action.run(task_vars=task_vars)
    record = json.loads((tmp_path / "r1" / ("%s.json" % HOST)).read_text())
    return result, record


def test_a_change_drains_installs_restarts_waits_rejoins_and_saves_in_that_order(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True, "exists": True}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert not result.get("failed") and result["changed"] is True, result
    # install and restart in ONE run on the host (no systemd_service run on the critical path)
    assert host.names() == ["sglang_unit_files", "sglang_ready", "sglang_last_good"]
    assert host.calls[0][1]["restart"] == {"unit": "sglang.service", "force": False}
    wait = host.calls[1][1]
    assert wait["after_invocation"] == OLD and wait["expect"] == INTENT["expect"] and "api_key" not in wait
    saved = host.calls[2][1]
    assert saved["state"] == "saved" and saved["record"]["invocation_id"] == NEW and saved["record"]["intent"] == INTENT
    assert router.calls == ["absent", "present"]
    assert [s["step"] for s in record["steps"]] == ["prepared", "draining", "applying", "verified", "rejoined"]
    assert record["status"] == "updated" and record["new_invocation"] == NEW and record["last_good_saved"] is True
    assert record["in_router"] is True and record["time_to_ready"] == 7.5
    steps = dict((s["step"], s["at"]) for s in record["steps"])
    assert steps["verified"] <= record["rejoined_at"] <= steps["rejoined"]  # back in the router before the save
    assert result["record"] == record
    assert any("verified invocation %s; putting it back into the router" % NEW in line for line in shown.lines)


def test_a_failed_wait_reverts_verifies_the_revert_and_only_then_rejoins(tmp_path, shown, monkeypatch):
    restored = {"changed": True,
                "record": {"intent": {"expect": {"draft_window_size": 1024}, "config_line": "required"}}}
    host = Host(sglang_unit_files=[INSTALLED], systemd_service=[{"changed": True}],
                sglang_ready=[{"failed": True, "verdict": "mismatch", "invocation_id": NEW, "msg": "logged 1024"},
                              dict(PASS, invocation_id="cccc", observed={"draft_window_size": 1024})],
                sglang_info=[{"invocation_id": NEW}], sglang_last_good=[restored])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] is True and result["failed_step"] == hp.WAIT
    assert host.names() == ["sglang_unit_files", "sglang_ready", "sglang_last_good", "sglang_info",
                            "systemd_service", "sglang_ready"]
    assert host.calls[2][1] == {"unit": "sglang.service", "directory": "/var/lib/lg", "state": "restored"}
    revert_wait = host.calls[5][1]
    assert revert_wait["after_invocation"] == NEW and revert_wait["expect"] == {"draft_window_size": 1024}
    assert router.calls == ["absent", "present"]  # back only once the reverted process was verified
    assert record["status"] == "reverted" and record["failed_task"] == hp.WAIT
    assert record["in_router"] is True and record["reverted"] is True and "logged 1024" in record["error"]
    assert "sglang_last_good" not in [n for n, a in host.calls if a.get("state") == "saved"]


def test_a_revert_that_fails_leaves_the_host_out_of_the_router(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[INSTALLED], systemd_service=[{"changed": True}],
                sglang_ready=[{"failed": True, "verdict": "died", "msg": "exited"},
                              {"failed": True, "verdict": "died", "msg": "exited again"}],
                sglang_info=[{"invocation_id": NEW}], sglang_last_good=[{"changed": True, "record": {"intent": {}}}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] and router.calls == ["absent"]
    assert record["status"] == "failed" and record["in_router"] is False and "FAILED too" in record["outcome"]


def test_drop_ins_that_override_the_role_fail_before_anything_changes(tmp_path, shown, monkeypatch):
    host, router = Host(), Router()
    result, record = act(tmp_path, host, router, the_drift=drift(blocking=["override.conf sets ExecStart="]),
                         monkeypatch=monkeypatch)
    assert result["failed"] and host.calls == [] and router.calls == []
    assert result["changed"] is False and record["status"] == "failed" and record["failed_task"] == hp.BLOCKING
    assert "nothing on the host had changed" in record["outcome"] and record["in_router"] is True


def test_a_connection_lost_while_installing_is_recorded_and_nothing_more_is_done(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[AnsibleConnectionFailure("Failed to connect to the host via ssh")])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] and host.names() == ["sglang_unit_files"] and router.calls == ["absent"]
    assert record["connection_lost"] is True and record["in_router"] is False and "lost" in record["outcome"]


def test_a_router_that_refuses_the_rejoin_leaves_a_verified_host_as_it_is(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS])
    router = Router(present=[{"failed": True, "msg": "Connection refused"}])
    router.answers["present"] = [action_mod.RouterError("router at http://router:30080: Connection refused")]
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] and result["failed_step"] == action_mod.REJOIN
    assert router.calls == ["absent", "present", "present"]  # rejoin_retries 1: two attempts
    assert host.names() == ["sglang_unit_files", "sglang_ready"]  # not reverted, not saved
    assert record["status"] == "verified, not rejoined" and record["in_router"] is False and record["reverted"] is False


def test_nothing_to_install_verifies_the_running_process_without_a_restart(tmp_path, shown, monkeypatch):
    host = Host(sglang_ready=[dict(PASS, invocation_id=OLD)], sglang_last_good=[{"changed": False, "exists": True}])
    router = Router()
    result, record = act(tmp_path, host, router, the_drift=drift(changed_files=[], in_sync=True), router_url="",
                         monkeypatch=monkeypatch)
    assert not result.get("failed") and host.names() == ["sglang_ready", "sglang_last_good"]
    assert "after_invocation" not in host.calls[0][1] and router.calls == []
    assert record["status"] == "unchanged (verified)" and record["in_router"] is None
    assert "rejoined_at" not in record  # no router: never out of it


def test_a_first_change_keeps_what_runs_before_touching_the_unit(tmp_path, shown, monkeypatch):
    host = Host(sglang_last_good=[{"changed": True, "exists": True}], sglang_unit_files=[INSTALLED],
                sglang_ready=[PASS])
    result, record = act(tmp_path, host, Router(), the_drift=drift(last_good={"exists": False}, restart_pending=True),
                         monkeypatch=monkeypatch)
    assert not result.get("failed")
    assert host.names()[:2] == ["sglang_last_good", "sglang_unit_files"]
    assert host.calls[1][1]["restart"] == {"unit": "sglang.service", "force": True}  # pending: restart regardless
    adopt = host.calls[0][1]
    assert adopt["state"] == "saved" and adopt["from_process"] is True and adopt["record"]["adopted"] is True


def test_a_restart_pending_without_file_changes_restarts(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[{"changed": True, "restarted": True, "status": {"InvocationID": OLD}}],
                sglang_ready=[PASS])
    result, record = act(tmp_path, host, Router(), the_drift=drift(changed_files=[], restart_pending=True),
                         monkeypatch=monkeypatch)
    assert not result.get("failed") and host.names()[:2] == ["sglang_unit_files", "sglang_ready"]
    assert host.calls[0][1] == {"restart": {"unit": "sglang.service", "force": True}}
    assert host.calls[1][1]["after_invocation"] == OLD and record["status"] == "updated"


def test_missing_accounts_are_created_before_the_unit_is_installed(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[dict(INSTALLED, status={})], sglang_ready=[PASS])
    result, dummy = act(tmp_path, host, Router(), monkeypatch=monkeypatch,
                        the_drift=drift(missing_accounts=["group sglang", "user sglang"], invocation_id=None),
                        settings={"sglang_user": "sglang", "sglang_group": "sglang"})
    assert not result.get("failed")
    assert host.names()[:3] == ["group", "user", "sglang_unit_files"]
    assert host.calls[1][1]["group"] == "sglang" and "after_invocation" not in host.calls[3][1]


def test_bad_arguments_fail_before_anything(tmp_path, shown, monkeypatch):
    host, router = Host(), Router()
    with pytest.raises(Exception) as raised:
        act(tmp_path, host, router, monkeypatch=monkeypatch, run={"run_id": "x"})
    assert "run must be the result of sglang_rollout" in str(raised.value)
    assert host.calls == [] and router.calls == []


def test_a_refused_capacity_check_fails_the_host_before_it_leaves_the_router(tmp_path, shown, monkeypatch):
    host, router = Host(), Router()
    refusal = {"failed": True, "msg": "capacity guard: taking http://gpu-1:30000 out of the router would leave 2 "
                                      "healthy worker(s) of this rollout's group, below rollout_min_healthy 3"}
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch, capacity=refusal)
    assert result["failed"] and host.calls == [] and router.calls == []
    assert record["status"] == "failed" and record["failed_task"] == action_mod.CAPACITY
    assert "capacity guard" in record["error"] and record["in_router"] is True and record["reverted"] is False
    ok, dummy = act(tmp_path / "ok", Host(sglang_ready=[PASS]), Router(), monkeypatch=monkeypatch,
                    capacity={"changed": False, "remaining": 3, "required": 3},
                    the_drift=drift(changed_files=[], in_sync=True))
    assert not ok.get("failed")


def test_with_verification_off_a_restarted_host_is_recorded_as_updated_not_verified_and_not_kept_as_last_good(
        tmp_path, shown, monkeypatch):
    """sglang_verify false: nothing saw the new process. The record must not say it was verified or
    unchanged, and its unit must not become last-known-good (a revert would bring it back as good)."""
    host = Host(sglang_unit_files=[INSTALLED])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch, settings={"sglang_verify": False})
    assert not result.get("failed") and result["changed"] is True, result
    assert host.names() == ["sglang_unit_files"]  # no wait, no last-known-good saved
    assert record["status"] == "updated (not verified)"
    assert record["restarted"] is True and record["verified"] is False and record["new_invocation"] is None
    assert record["last_good_saved"] is False and "not verified" in record["last_good_note"]
    assert [s["step"] for s in record["steps"]] == ["prepared", "draining", "applying", "verified", "rejoined"]
    assert any("not verified (sglang_verify is off)" in line for line in shown.lines)
    assert not any("verified invocation" in line for line in shown.lines)


def test_with_verification_off_a_host_that_needed_no_restart_is_unchanged_not_verified(tmp_path, shown, monkeypatch):
    host = Host()
    router = Router()
    result, record = act(tmp_path, host, router, the_drift=drift(changed_files=[], in_sync=False), router_url="",
                         monkeypatch=monkeypatch, settings={"sglang_verify": False})
    assert not result.get("failed") and host.calls == []
    assert record["status"] == "unchanged (not verified)" and record["restarted"] is False
    assert record["verified"] is False and record["last_good_saved"] is False


def test_a_restart_that_fails_after_the_install_is_the_restart_step_and_a_change_that_reverts(
        tmp_path, shown, monkeypatch):
    """The merged install+restart: files written, then systemctl restart failed - the failed step is the
    restart (not the install), the host changed, and the last-known-good unit is brought back."""
    restart_failed = {"failed": True, "failed_at": "restart", "changed": True, "changed_files": [UNIT_PATH],
                      "restarted": False, "msg": "%s written, but restart sglang.service failed (exit 1)" % UNIT_PATH}
    host = Host(sglang_unit_files=[restart_failed], sglang_info=[{"invocation_id": OLD}],
                sglang_last_good=[{"changed": True, "record": {"intent": {"expect": {"draft_window_size": 1024}}}}],
                systemd_service=[{"changed": True}], sglang_ready=[dict(PASS, invocation_id="cccc")])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] and result["failed_step"] == hp.RESTART and result["changed"] is True
    assert host.names() == ["sglang_unit_files", "sglang_last_good", "sglang_info", "systemd_service", "sglang_ready"]
    assert record["status"] == "reverted" and record["failed_task"] == hp.RESTART
    assert router.calls == ["absent", "present"]


def test_an_install_that_writes_nothing_restarts_nothing(tmp_path, shown, monkeypatch):
    """The drift said the unit differs, but it was already right when written (another operator): no restart,
    the running process is verified instead."""
    host = Host(sglang_unit_files=[{"changed": False, "changed_files": [], "restarted": False}],
                sglang_ready=[dict(PASS, invocation_id=OLD)], sglang_last_good=[{"changed": False, "exists": True}])
    result, record = act(tmp_path, host, Router(), monkeypatch=monkeypatch)
    assert not result.get("failed") and host.names() == ["sglang_unit_files", "sglang_ready", "sglang_last_good"]
    assert "after_invocation" not in host.calls[1][1] and record["status"] == "unchanged (verified)"


# ------------------------------------------------------------------ the config file (API key) without a template

CONFIG = {"path": "/etc/sglang/sglang.yaml", "mode": "0640", "owner": "root", "group": "sglang"}


def test_the_config_file_is_written_from_the_prepared_path_and_the_waits_api_key(tmp_path, shown, monkeypatch):
    # drift.prepared names the config file (no content); the key comes from sglang_api_key.
    host = Host(sglang_unit_files=[dict(INSTALLED, changed_files=[UNIT_PATH, CONFIG["path"]])], sglang_ready=[PASS],
                sglang_last_good=[{"changed": True, "exists": True}])
    the_drift = drift(changed_files=[UNIT_PATH, CONFIG["path"]], prepared={"config_file": CONFIG})
    result, record = act(tmp_path, host, Router(), the_drift=the_drift, monkeypatch=monkeypatch,
                         settings={"sglang_api_key": 'k"ey\U0001F600'})
    assert not result.get("failed"), result
    installed = host.calls[0][1]
    assert installed["secret_files"] == [dict(CONFIG, content='api-key: "k\\"ey\\U0001f600"\n')]
    assert 'k"ey' not in json.dumps(record) and "api-key" not in json.dumps(result)


def test_no_config_file_is_written_without_a_prepared_one(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS])
    act(tmp_path, host, Router(), monkeypatch=monkeypatch)  # drift() has no prepared.config_file
    assert host.calls[0][1]["secret_files"] == []


def test_a_prepared_config_file_without_an_api_key_fails_before_anything(tmp_path, shown, monkeypatch):
    host = Host()
    router = Router()
    result, record = act(tmp_path, host, router, the_drift=drift(prepared={"config_file": CONFIG}),
                         monkeypatch=monkeypatch)
    assert result["failed"] and "names an SGLang config file" in result["msg"] and "sglang_api_key is empty" in \
        result["msg"], result
    assert host.calls == [] and router.calls == []
    assert record["status"] == "failed" and record["in_router"] is True, record


def test_the_worker_leaves_and_rejoins_the_router_with_the_servers_own_key(tmp_path, shown, monkeypatch):
    # The router calls a worker with the key it was added with (/health needs none): without it, it
    # would list the worker healthy and forward requests that are refused. The drain reads the
    # worker's load with it too.
    params = []

    def router(values, check_mode):
        params.append(dict(values))
        return {"changed": True, "workers": [], "drain_seconds": 0.1}
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True}])
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch, settings={"sglang_api_key": "s3rv3r-key"})
    assert not result.get("failed"), result
    assert [(p["state"], p["worker_api_key"]) for p in params] == [("absent", "s3rv3r-key"), ("present", "s3rv3r-key")]
    assert "s3rv3r-key" not in json.dumps(record)
    # Without a server key, none is sent.
    params[:] = []
    act(tmp_path / "b", Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS]), router, monkeypatch=monkeypatch)
    assert [p["worker_api_key"] for p in params] == [None, None]


# ------------------------------------------------------------------ a rollout that changes the API key

def rotation(**changes):
    """drift() of a host whose config file (the API key) differs from the intended one."""
    return drift(changed_files=[UNIT_PATH, CONFIG["path"]], prepared={"config_file": CONFIG}, **changes)


NEW_KEY = {"sglang_api_key": "n3w-key"}


KEYED_COMMAND = ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--config", CONFIG["path"],
                 "--model-path", "/models/m"]


def test_a_revert_during_a_key_rotation_waits_with_the_restored_key_and_stays_out_of_the_router(
        tmp_path, shown, monkeypatch):
    restored = {"changed": True, "record": {"intent": {"expect": {"draft_window_size": 1024},
                                                       "command": KEYED_COMMAND}}}
    host = Host(sglang_unit_files=[dict(INSTALLED, changed_files=[UNIT_PATH, CONFIG["path"]])],
                systemd_service=[{"changed": True}],
                sglang_ready=[{"failed": True, "verdict": "mismatch", "invocation_id": NEW, "msg": "logged 1024"},
                              dict(PASS, invocation_id="cccc", observed={"draft_window_size": 1024})],
                sglang_info=[{"invocation_id": NEW}], sglang_last_good=[restored])
    router = Router()
    result, record = act(tmp_path, host, router, the_drift=rotation(), monkeypatch=monkeypatch, settings=NEW_KEY)
    assert result["failed"] is True
    first_wait, revert_wait = [args for name, args in host.calls if name == "sglang_ready"]
    assert first_wait["api_key"] == "n3w-key" and "api_key_file" not in first_wait
    # the reverted process runs with the restored config file's (old) key: read there, on the host
    assert revert_wait["api_key_file"] == CONFIG["path"] and "api_key" not in revert_wait
    assert router.calls == ["absent"]  # not re-added with a key the reverted host refuses
    assert record["status"] == "reverted" and record["in_router"] is False, record
    assert "NOT back in the router: the host was reverted to the previous API key" in record["outcome"], record
    assert "n3w-key" not in json.dumps(record)


def test_a_failed_drain_during_a_key_rotation_leaves_the_host_out_of_the_router(tmp_path, shown, monkeypatch):
    router = Router(absent=[{"failed": True, "msg": "still has 2 in-flight request(s) after 300s"}])
    host = Host()
    result, record = act(tmp_path, host, router, the_drift=rotation(), monkeypatch=monkeypatch, settings=NEW_KEY)
    assert result["failed"] is True and host.calls == []
    assert router.calls == ["absent"], router.calls  # the old process would refuse the new key
    assert record["in_router"] is False and "the host runs the previous API key" in record["outcome"], record
    # Without a rotation, the same failed drain puts the unchanged host back.
    router = Router(absent=[{"failed": True, "msg": "still has 2 in-flight request(s) after 300s"}])
    result, record = act(tmp_path / "b", Host(), router, monkeypatch=monkeypatch)
    assert router.calls == ["absent", "present"] and record["in_router"] is True, record


def failing_then_reverted(command):
    return Host(sglang_unit_files=[INSTALLED], systemd_service=[{"changed": True}],
                sglang_ready=[{"failed": True, "verdict": "mismatch", "invocation_id": NEW, "msg": "logged 1024"},
                              dict(PASS, invocation_id="cccc")],
                sglang_info=[{"invocation_id": NEW}],
                sglang_last_good=[{"changed": True, "record": {"intent": {"command": command}}}])


@pytest.mark.parametrize("case, the_drift, command, settings, file_read, back", [
    # the reverted unit has no --config: no key, whatever the settings say; a key added by the rollout
    # does no harm to a server without one, so it goes back into the router
    ("no key before", drift(), ["python3", "-m", "sglang.launch_server"], NEW_KEY, None, True),
    ("key added", rotation(), ["python3", "-m", "sglang.launch_server"], NEW_KEY, None, True),
    # the same key (the config file did not change): read from the file, and back into the router
    ("same key", drift(prepared={"config_file": CONFIG}), KEYED_COMMAND, NEW_KEY, CONFIG["path"], True),
    # the key removed: the reverted process has one, the router would call it without: left out
    ("key removed", drift(), KEYED_COMMAND, {"sglang_api_key": ""}, CONFIG["path"], False),
])
def test_the_reverted_process_is_waited_for_with_the_key_of_its_own_command(
        tmp_path, shown, monkeypatch, case, the_drift, command, settings, file_read, back):
    host = failing_then_reverted(command)
    router = Router()
    result, record = act(tmp_path, host, router, the_drift=the_drift, monkeypatch=monkeypatch, settings=settings)
    revert_wait = [args for name, args in host.calls if name == "sglang_ready"][1]
    assert revert_wait.get("api_key_file") == file_read and "api_key" not in revert_wait, case
    assert router.calls == (["absent", "present"] if back else ["absent"]), case
    assert record["status"] == "reverted" and record["in_router"] is back, (case, record)
    assert ("previous API key" in record["outcome"]) is (not back), (case, record["outcome"])


def test_a_drain_that_fails_before_the_removal_leaves_the_worker_listed_and_says_so(tmp_path, shown, monkeypatch):
    # The load could not be read (e.g. the running process refuses the new key): the router was not
    # touched, so nothing is re-added (with a key the host refuses) and the record says it is in the router.
    router = Router(absent=[{"failed": True, "msg": "reading the load of http://gpu-1:30000: HTTP 401"}])
    result, record = act(tmp_path, Host(), router, the_drift=rotation(), monkeypatch=monkeypatch,
                         settings=NEW_KEY, listed=True)
    assert result["failed"] and router.calls == ["absent"], router.calls
    assert record["in_router"] is True and "OUT of the router" not in record["outcome"], record


class _Listing(object):
    """RouterClient for _still_listed: the router's workers, or a RouterError when it cannot be read."""
    workers = []
    error = None

    def __init__(self, url, api_key, timeout):
        self.url, self.api_key = url, api_key

    def list_workers(self):
        if self.error:
            raise action_mod.RouterError(self.error)
        return self.workers


@pytest.mark.parametrize("workers, error, listed", [
    ([{"url": "http://gpu-1:30000"}, {"url": "http://gpu-2:30000"}], None, True),
    ([{"url": "http://gpu-2:30000"}], None, False),
    ([], "HTTP 503 from the router", False),  # unreadable: treated as out of the router
])
def test_still_listed_reads_the_routers_workers_and_an_unreadable_router_counts_as_not_listed(
        monkeypatch, workers, error, listed):
    monkeypatch.setattr(_Listing, "workers", workers)
    monkeypatch.setattr(_Listing, "error", error)
    monkeypatch.setattr(action_mod, "RouterClient", _Listing)
    action = fakes.make_action(action_mod, {}, action="gpufleet.inference.sglang_rollout_host")
    action._router_args = {"url": "http://router:30000", "api_key": "", "worker_url": "http://gpu-1:30000"}
    assert action._still_listed() is listed


# ------------------------------------------------------------------ the host's record and lease, step by step

def test_each_step_is_written_on_the_host_with_the_lease_renewed_before_its_work(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True, "exists": True}])
    result, record = act(tmp_path, host, Router(), monkeypatch=monkeypatch)
    assert not result.get("failed"), result
    assert host.holds() == ["draining", "applying", "verified", "rejoined"]
    first = host.leases[0][1]
    assert first["holder"]["generation"] == 7 and first["holder"]["session"] == "s1" and first["state"] == "held"
    assert first["record"]["drained_by"] == "r1" and first["record"]["intent_digest"] == "d1"
    last = host.records[-1]
    assert last["step"] == "rejoined" and last["drained_by"] is None and last["in_router"] is True and last["worker_url"] == "http://gpu-1:30000"


def test_a_host_unreachable_before_its_first_step_is_never_drained_and_says_it_is_still_in_the_router(
        tmp_path, shown, monkeypatch):
    host = Host(sglang_lease=[{"unreachable": True, "msg": "ssh: connect to host gpu-1 port 22: Connection refused"}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] and host.calls == [] and router.calls == []  # nothing drained, nothing changed
    assert record["status"] == "failed" and record["in_router"] is True and record["connection_lost"] is True
    assert "was not taken out of the router" in record["outcome"] and "previous unit" in record["runs"]


def test_a_lease_taken_over_by_another_writer_stops_the_host_untouched(tmp_path, shown, monkeypatch):
    host = Host(sglang_lease=[{"failed": True, "msg": "this run's lease of the host was taken over: it is now "
                                                      "held by sweep sw-1 on bastion-3 by carol"}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] and host.calls == [] and router.calls == []
    assert "held by sweep sw-1" in result["msg"] and record["in_router"] is True, record


def test_a_host_the_router_does_not_list_is_not_drained_and_rejoins_at_its_url(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch, drain_url=None)
    assert not result.get("failed") and router.calls == ["present"], router.calls


def test_a_port_change_drains_the_old_worker_and_rejoins_the_new_one(tmp_path, shown, monkeypatch):
    params = []

    def router(values, check_mode):
        params.append((values["state"], values["worker_url"]))
        return {"changed": True, "workers": [], "drain_seconds": 0.1}
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True}])
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch, drain_url="http://gpu-1:30001")
    assert params == [("absent", "http://gpu-1:30001"), ("present", "http://gpu-1:30000")]


def test_a_host_an_operator_took_out_of_the_router_is_changed_and_left_out(tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch,
                         plan={"drain_url": None, "stay_out": True})
    assert not result.get("failed") and router.calls == [], router.calls  # neither drained nor put in
    assert record["status"] == "updated, left out of the router" and record["in_router"] is False, record
    assert record["continue_rollout"] is True


def test_a_lease_taken_over_mid_change_is_neither_reverted_nor_put_back(tmp_path, shown, monkeypatch):
    """The install carries the lease (its record of step applying): the module refuses before it writes a file."""
    taken = {"failed": True, "action": "refused", "changed": False, "msg": "sglang.service: this run's lease of the "
             "host was taken over: it is now held by rollout r-9 on awx-7 by bob. Nothing was changed."}
    host = Host(sglang_unit_files=[taken], sglang_last_good=[{"changed": True, "exists": True}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    # it had left the router (draining); the new holder owns it now: no install, no revert, no rejoin
    assert result["failed"] and result["failed_step"] == hp.HOLD and router.calls == ["absent"], router.calls
    assert host.names() == ["sglang_unit_files"] and result["changed"] is False, host.names()
    assert host.holds() == ["draining"]  # the applying step never reached the host
    assert record["status"] == "failed" and record["reverted"] is False and record["in_router"] is False
    assert "its lease was taken over by another writer" in record["outcome"], record
    assert "at step draining" in record["outcome"], record


def test_a_lease_taken_over_before_the_rejoin_keeps_the_host_out_and_unreverted(tmp_path, shown, monkeypatch):
    """The verified step has no module of its own: its lease run is the check before the host rejoins."""
    taken = {"failed": True, "action": "refused", "msg": "this run's lease of the host was taken over: it is now "
             "held by rollout r-9 on awx-7 by bob"}
    host = Host(sglang_lease=[{"changed": True, "lease": {"generation": 7}}, taken], sglang_unit_files=[INSTALLED],
                sglang_ready=[PASS], sglang_last_good=[{"changed": True, "exists": True}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] and result["failed_step"] == hp.HOLD and router.calls == ["absent"], router.calls
    assert host.names() == ["sglang_unit_files", "sglang_ready"], host.names()  # neither reverted nor saved
    assert host.holds() == ["draining", "applying"]
    assert record["status"] == "failed" and record["reverted"] is False and record["in_router"] is False
    assert "at step applying" in record["outcome"], record


def test_each_step_is_recorded_on_the_host_before_its_work_riding_on_the_steps_own_module(
        tmp_path, shown, monkeypatch):
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True, "exists": True}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert not result.get("failed") and record["status"] == "updated", record
    assert host.written == [("draining", "sglang_lease"), ("applying", "sglang_unit_files"),
                            ("verified", "sglang_lease"), ("rejoined", "sglang_last_good")], host.written
    # a host with nothing to keep as last-known-good (the analysis could not clear it, or sglang_verify is off):
    # its rejoined step is a lease run of its own, after the rejoin
    host = Host(sglang_unit_files=[INSTALLED])
    result, record = act(tmp_path, host, Router(), monkeypatch=monkeypatch, settings={"sglang_verify": False})
    assert not result.get("failed") and host.names() == ["sglang_unit_files"], host.names()
    assert host.written[-1] == ("rejoined", "sglang_lease") and host.holds() == [
        "draining", "applying", "verified", "rejoined"], host.written


# ------------------------------------------------------------------ the canary analysis

ANALYSIS = {"enabled": True, "canary": HOST, "baseline": "gpu-2", "baseline_url": "http://gpu-2:30000",
            "isolate": False, "on_inconclusive": "stop", "workload": {"num_prompts": 4}, "thresholds": {}, "rounds": 4}


class FakeAnalysis(object):
    """_canary.Analysis scripted: records the parameters, answers a verdict."""
    seen = []

    def __init__(self, verdict):
        self.verdict = verdict

    def __call__(self, params, progress=None):
        FakeAnalysis.seen.append(params)
        return self

    def run(self):
        return {"verdict": self.verdict, "message": "%s: TPOT p50 +29.9%%" % self.verdict, "metrics": [],
                "baseline": {"name": "gpu-2"}}


def analysed(monkeypatch, verdict):
    FakeAnalysis.seen = []
    monkeypatch.setattr(action_mod.Analysis, "prepare", FakeAnalysis(verdict))


def test_the_canary_that_passes_its_analysis_is_kept_and_the_record_says_against_whom(tmp_path, shown, monkeypatch):
    analysed(monkeypatch, "pass")
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True, "exists": True}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch, analysis=ANALYSIS,
                         hostvars={"gpu-2": {"sglang_api_key": "k2"}})
    params = FakeAnalysis.seen[0]
    assert params["canary"]["url"] == "http://gpu-1:30000" and params["baseline"] == {
        "name": "gpu-2", "url": "http://gpu-2:30000", "api_key": "k2"}
    assert params["rounds"] == 4 and params["router_url"] == "http://router:30080"
    assert router.calls == ["absent", "present"]  # compared while both serve (not isolated)
    assert record["status"] == "updated" and record["analysis"]["verdict"] == "pass" and record["last_good_saved"]
    assert ("sglang_last_good", "saved") in [(n, a.get("state")) for n, a in host.calls]


class LongAnalysis(FakeAnalysis):
    """Two rounds of 150 s each on the action's clock: half of a 300 s lease each."""

    def __init__(self, verdict, clock):
        super(LongAnalysis, self).__init__(verdict)
        self.clock, self.progress = clock, None

    def __call__(self, params, progress=None):
        self.progress = progress
        return super(LongAnalysis, self).__call__(params, progress)

    def run(self):
        for number in (1, 2):
            self.clock["now"] += 150
            self.progress("round %d/2" % number)
        return super(LongAnalysis, self).run()


def test_a_long_canary_analysis_keeps_the_hosts_lease_renewed_between_its_rounds(tmp_path, shown, monkeypatch):
    clock = {"now": 1000.0}
    monkeypatch.setattr(action_mod.time, "monotonic", lambda: clock["now"])
    FakeAnalysis.seen = []
    monkeypatch.setattr(action_mod.Analysis, "prepare", LongAnalysis("pass", clock))
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True, "exists": True}])
    result, record = act(tmp_path, host, Router(), monkeypatch=monkeypatch, analysis=ANALYSIS,
                         hostvars={"gpu-2": {"sglang_api_key": "k2"}})
    assert record["status"] == "updated" and FakeAnalysis.seen, record
    # each round came a third of the lease or more after the last renewal: renewed (no record) between verified
    # and rejoined
    assert host.holds() == ["draining", "applying", "verified", None, None, "rejoined"], host.holds()
    assert any("canary analysis: round 2/2" in line for line in shown.lines)


def test_a_canary_slower_than_its_baseline_leaves_the_router_is_reverted_and_stops_the_rollout(
        tmp_path, shown, monkeypatch):
    analysed(monkeypatch, "regression")
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS, dict(PASS, invocation_id="cccc")],
                sglang_info=[{"invocation_id": NEW}], sglang_last_good=[{"changed": True, "record": {"intent": INTENT}}],
                systemd_service=[{"changed": True}])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch, analysis=ANALYSIS)
    assert result["failed"] and result["failed_step"] == action_mod.ANALYSIS
    # in, then out again for the revert, then back once the reverted process is verified
    assert router.calls == ["absent", "present", "absent", "present"], router.calls
    assert record["status"] == "reverted" and record["analysis"]["verdict"] == "regression", record
    assert "TPOT p50 +29.9%" in record["message"] and record["continue_rollout"] is False
    states = [a.get("state") for n, a in host.calls if n == "sglang_last_good"]
    assert "saved" not in states and "restored" in states  # the slower unit never became last-known-good


def test_an_inconclusive_analysis_holds_the_rollout_and_keeps_nothing(tmp_path, shown, monkeypatch):
    analysed(monkeypatch, "inconclusive")
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS])
    result, record = act(tmp_path, host, Router(), monkeypatch=monkeypatch, analysis=ANALYSIS)
    assert record["status"] == "updated, analysis inconclusive" and record["continue_rollout"] is False
    assert "sglang_last_good" not in host.names() and record["last_good_saved"] is False
    # with on_inconclusive continue it goes on and keeps the unit
    analysed(monkeypatch, "inconclusive")
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True, "exists": True}])
    result, record = act(tmp_path, host, Router(), monkeypatch=monkeypatch,
                         analysis=dict(ANALYSIS, on_inconclusive="continue"))
    assert record["status"] == "updated" and record["last_good_saved"] is True


def test_isolated_the_canary_is_compared_before_it_rejoins_and_the_baseline_leaves_and_comes_back(
        tmp_path, shown, monkeypatch):
    analysed(monkeypatch, "pass")
    calls = []

    def router(values, check_mode):
        calls.append((values["state"], values["worker_url"]))
        return {"changed": True, "workers": [], "drain_seconds": 0.1}
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True}])
    act(tmp_path, host, router, monkeypatch=monkeypatch, analysis=dict(ANALYSIS, isolate=True))
    assert calls == [("absent", "http://gpu-1:30000"), ("absent", "http://gpu-2:30000"),
                     ("present", "http://gpu-2:30000"), ("present", "http://gpu-1:30000")], calls


def test_only_the_canary_is_analysed(tmp_path, shown, monkeypatch):
    analysed(monkeypatch, "regression")
    host = Host(sglang_unit_files=[INSTALLED], sglang_ready=[PASS], sglang_last_good=[{"changed": True}])
    result, record = act(tmp_path, host, Router(), monkeypatch=monkeypatch, analysis=dict(ANALYSIS, canary="gpu-9"))
    assert not result.get("failed") and FakeAnalysis.seen == [] and "analysis" not in record


# ------------------------------------------------------------------ the head of a serving group

FOLLOWER = "gpu-2"
GROUP = {"name": "g", "head": HOST, "followers": [FOLLOWER], "ranks": {HOST: 0, FOLLOWER: 1}, "nnodes": 2}
FOLLOWER_INTENT = dict(INTENT, expect={}, config_line="optional", follower=True)
FOLLOWER_PASS = {"verdict": "pass", "verified": True, "invocation_id": "f-new", "msg": "joined its serving group"}


class NodeAction(object):
    """What plugin_utils/_nodes makes for a follower: an action whose modules run on that follower."""

    def __init__(self, host):
        from unittest.mock import MagicMock
        self._execute_module = host
        self._task = MagicMock(check_mode=False)
        self._connection = MagicMock()


def grouped(tmp_path, monkeypatch, head, follower, router, follower_drift=None):
    """The head's task with its follower's modules scripted by `follower`."""
    made = []

    class Runners(object):
        def __init__(self, action, task_vars, progress=True, prefix=""):
            pass

        def __call__(self, name):
            made.append(name)
            return ready_mod.ActionRunner(NodeAction(follower), {}, name, False)

        def close(self):
            made.append("closed")
    monkeypatch.setattr(action_mod, "NodeRunners", Runners)
    their_drift = dict(follower_drift or drift(invocation_id="f-old"), prepared=dict(
        PREPARED, intent=FOLLOWER_INTENT, group=dict(GROUP, rank=1),
        endpoint={"url": "http://gpu-2:30000", "worker_url": "http://gpu-2:30000"}))
    run_dir = tmp_path / "r1"
    result, record = act(tmp_path, head, router, monkeypatch=monkeypatch, prepared={"group": dict(GROUP, rank=0)},
                         hostvars={FOLLOWER: {"sglang_drift": their_drift, "rollout_lease": {"lease": {"generation": 3}}}})
    return result, record, json.loads((run_dir / ("%s.json" % FOLLOWER)).read_text()), made


def test_a_groups_head_rolls_out_its_group_as_one_each_node_recorded_on_itself(tmp_path, shown, monkeypatch):
    written = {"changed": True, "changed_files": [UNIT_PATH]}
    stopped = {"changed": True, "status": {"InvocationID": OLD}}
    head = Host(sglang_unit_files=[written], systemd_service=[stopped, {"changed": True}], sglang_ready=[PASS],
                sglang_last_good=[{"changed": True, "exists": True}])
    follower = Host(sglang_unit_files=[written], systemd_service=[dict(stopped, status={"InvocationID": "f-old"}),
                                                                  {"changed": True}],
                    sglang_ready=[FOLLOWER_PASS], sglang_last_good=[{"changed": True, "exists": True}])
    router = Router()
    result, record, theirs, made = grouped(tmp_path, monkeypatch, head, follower, router)
    assert not result.get("failed"), result
    assert head.names() == ["sglang_unit_files", "systemd_service", "systemd_service", "sglang_ready", "sglang_last_good"]
    assert follower.names() == ["sglang_unit_files", "systemd_service", "systemd_service", "sglang_ready",
                                "sglang_last_good"]
    assert follower.calls[3][1]["follower"] is True and follower.calls[3][1]["after_invocation"] == "f-old"
    assert router.calls == ["absent", "present"]  # only the head is a router worker
    assert record["status"] == "updated" and record["new_invocation"] == NEW
    assert theirs["status"] == "updated" and theirs["new_invocation"] == "f-new" and theirs["in_router"] is None
    assert theirs["last_good_saved"] is True
    # every node's step is written on that node first, with its own lease
    assert follower.holds() == ["draining", "applying", "verified", "rejoined"]
    assert follower.leases[0][1]["holder"]["generation"] == 3  # its lease of this run, from the prepare phase
    assert made == [FOLLOWER, "closed"]


def test_a_follower_that_fails_reverts_the_whole_group_and_names_it(tmp_path, shown, monkeypatch):
    written = {"changed": True, "changed_files": [UNIT_PATH]}
    crash = {"failed": True, "verdict": "crash_loop", "invocation_id": "f-new",
             "msg": "sglang.service: invocation f-new exited and systemd is restarting it (crash loop)\nScheduler hit "
                    "an exception: CUDA error"}
    restored = {"changed": True, "changed_files": [UNIT_PATH], "record": {"intent": INTENT}}
    head = Host(sglang_unit_files=[written], sglang_ready=[PASS, PASS], sglang_info=[{"invocation_id": NEW}],
                sglang_last_good=[restored])
    follower = Host(sglang_unit_files=[written], sglang_ready=[crash, FOLLOWER_PASS],
                    sglang_info=[{"invocation_id": "f-new"}], sglang_last_good=[dict(restored, record={
                        "intent": FOLLOWER_INTENT})])
    router = Router()
    result, record, theirs, made = grouped(tmp_path, monkeypatch, head, follower, router)
    assert result["failed"] and result["failed_step"] == "Wait until every node of the serving group runs the " \
        "intended settings (its head serves)"
    assert "serving group g: node gpu-2 (rank 1) failed, so the group cannot serve" in result["msg"]
    assert "CUDA error" in result["msg"]
    assert record["status"] == "reverted" and theirs["status"] == "reverted" and theirs["in_router"] is None
    assert router.calls == ["absent", "present"]  # the head back once the reverted group was verified
    stops = [args["state"] for name, args in head.calls + follower.calls if name == "systemd_service"]
    assert stops.count("stopped") == 4 and stops.count("started") == 4  # the change, then the revert
    assert follower.holds()[-1] == "failed"


def test_a_groups_follower_missing_from_the_run_is_refused(tmp_path, shown, monkeypatch):
    monkeypatch.setattr(action_mod, "NodeRunners", lambda *a, **k: type("R", (), {"close": lambda self: None})())
    with pytest.raises(Exception, match="gpu-2 \\(rank 1 of serving group g\\) has no drift check"):
        act(tmp_path, Host(), Router(), monkeypatch=monkeypatch, prepared={"group": dict(GROUP, rank=0)},
            hostvars={})


def test_an_install_refused_before_it_held_the_lease_changed_nothing_and_is_neither_reverted_nor_kept_out(
        tmp_path, shown, monkeypatch):
    """sglang_unit_files checks owners and modes before it holds the lease: failing there, nothing was written."""
    bad_owner = {"failed": True, "msg": "user sglang does not exist", "changed_files": [], "lease": None}
    host = Host(sglang_unit_files=[bad_owner])
    router = Router()
    result, record = act(tmp_path, host, router, monkeypatch=monkeypatch)
    assert result["failed"] and result["failed_step"] == hp.INSTALL and result["changed"] is False
    assert host.names() == ["sglang_unit_files"], host.names()  # no revert: no restore, no restart
    assert host.holds() == ["draining", "failed"], host.holds()
    assert router.calls == ["absent", "present"] and record["in_router"] is True, record
    assert record["reverted"] is False and "nothing on the host had changed" in record["outcome"], record
