# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one host path: which modules each step runs, with which arguments, and what a failure leaves.

Modules and the sliced wait are scripted (``run(name, args)``, ``wait(args)``); the rollout's and the
role's action tests run the same steps through Ansible's plumbing."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _hostpath as hp

from fakes import NEW, OLD

UNIT = "/etc/systemd/system/sglang.service"
JOURNALD = "/etc/systemd/journald.conf.d/50-gpufleet-sglang.conf"
CONFIG = {"path": "/etc/sglang/sglang.yaml", "mode": "0640", "owner": "root", "group": "sglang"}
INTENT = {"expect": {"draft_window_size": 2048}, "config_line": "required", "command": ["py", "-m", "sglang"],
          "environment": {}}
SETTINGS = {"sglang_unit_name": "sglang.service", "sglang_api_key": "", "sglang_user": "sglang",
            "sglang_fleet_dir": "/f", "sglang_lease_seconds": 300, "sglang_ready_connection_retry_seconds": 120,
            "sglang_group": "sglang", "sglang_ready_timeout": 600, "sglang_min_ready_seconds": 10,
            "sglang_accept_unverified": False, "sglang_probe_prompt": "p", "sglang_probe_max_new_tokens": 8,
            "sglang_journal_grace": 35, "sglang_receipt_dir": "/r", "sglang_last_good_dir": "/lg",
            "sglang_progress": True, "sglang_verify": True}
PREPARED = {"version": "0.5.23", "intent": INTENT, "unit_text": "[Unit]\n", "journald_text": "[Journal]\n",
            "paths": {"unit": UNIT, "journald": JOURNALD}, "unit_files": [UNIT], "config_file": None,
            "endpoint": {"url": "http://127.0.0.1:30000", "worker_url": "http://gpu-1:30000"}}
PASS = {"verdict": "pass", "verified": True, "invocation_id": NEW, "observed": {"draft_window_size": 2048},
        "source": "journal", "msg": "serving"}


class Host(object):
    """Scripted modules (per short name, in order) and waits; records every call."""

    def __init__(self, waits=(), **answers):
        self.answers = dict((name, list(items)) for name, items in answers.items())
        self.waits = list(waits)
        self.calls = []

    def run(self, name, args):
        short = name.rsplit(".", 1)[-1]
        self.calls.append((short, dict(args)))
        queue = self.answers.get(short) or [{"changed": False}]
        return dict(queue.pop(0) if len(queue) > 1 else queue[0])

    def wait(self, args, between=None):
        self.calls.append(("sglang_ready", dict(args)))
        if between is not None:
            between()  # one slice ended
        return dict(self.waits.pop(0) if len(self.waits) > 1 else self.waits[0])

    def names(self):
        return [name for name, dummy in self.calls]


def drift(**changes):
    base = {"verdict": "drifted", "in_sync": False, "invocation_id": OLD, "active_state": "active", "enabled": True,
            "restart_pending": False, "changed_files": [UNIT], "missing_accounts": [], "blocking": [],
            "last_good": {"exists": True}, "receipt": None}
    base.update(changes)
    return base


def path(host, the_drift=None, settings=None, prepared=None):
    return hp.HostPath(host.run, host.wait, dict(SETTINGS, **(settings or {})), dict(PREPARED, **(prepared or {})),
                       the_drift or drift(), host="gpu-1")


def test_the_waits_arguments_are_built_in_one_place():
    args = hp.wait_args(SETTINGS, "http://h:1", INTENT, after=OLD, api_key="k")
    assert args == {"unit": "sglang.service", "url": "http://h:1", "expect": {"draft_window_size": 2048},
                    "config_line": "required", "command": ["py", "-m", "sglang"], "environment": {},
                    "after_invocation": OLD, "api_key": "k", "timeout": 600, "min_ready_seconds": 10,
                    "accept_unverified": False, "prompt": "p", "max_new_tokens": 8, "journal_grace": 35,
                    "receipt_dir": "/r", "progress": True, "connection_retry_seconds": 120}
    # a key file read on the host replaces the key; nothing empty is passed
    by_file = hp.wait_args(SETTINGS, "http://h:1", {}, api_key="k", api_key_file="/etc/sglang/old.yaml")
    assert by_file["api_key_file"] == "/etc/sglang/old.yaml" and "api_key" not in by_file
    assert "after_invocation" not in by_file and by_file["expect"] == {}
    assert "follower" not in args  # a server's wait, and a follower node's (its intent says so)
    assert hp.wait_args(SETTINGS, "http://h:1", dict(INTENT, follower=True))["follower"] is True


def test_apply_installs_and_restarts_in_one_run_then_waits_for_the_new_process():
    host = Host(waits=[PASS], sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "restarted": True,
                                                  "status": {"InvocationID": OLD}}])
    steps = path(host)
    verified = steps.apply()
    assert host.names() == ["sglang_unit_files", "sglang_ready"] and steps.changed
    assert host.calls[0][1]["restart"] == {"unit": "sglang.service", "force": False}
    assert host.calls[0][1]["files"] == [{"path": UNIT, "content": "[Unit]\n", "verify_unit": True}]
    assert host.calls[1][1]["after_invocation"] == OLD and verified["verdict"] == "pass"


def test_installing_without_restart_says_a_restart_is_due():
    host = Host(sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "restarted": False}])
    installed = path(host).install(restart=False)
    assert installed == {"changed_files": [UNIT], "restarted": False, "status": None, "restart_due": True}
    assert "restart" not in host.calls[0][1]
    # a file the drift saw differ but that was right when written: nothing is due
    host = Host(sglang_unit_files=[{"changed": False, "changed_files": [], "restarted": False}])
    assert path(host).install(restart=False)["restart_due"] is False


def test_accounts_and_journalds_drop_in_come_first():
    host = Host(waits=[PASS], sglang_unit_files=[{"changed": True}, {"changed": True, "changed_files": [UNIT],
                                                                     "restarted": True, "status": {}}])
    path(host, drift(missing_accounts=["group sglang", "user sglang"], changed_files=[UNIT, JOURNALD])).apply()
    assert host.names() == ["group", "user", "sglang_unit_files", "systemd_service", "sglang_unit_files",
                            "sglang_ready"]
    assert host.calls[2][1] == {"files": [{"path": JOURNALD, "content": "[Journal]\n"}]}
    assert host.calls[3][1] == {"name": "systemd-journald.service", "state": "restarted"}


def test_nothing_changed_verifies_the_running_process_and_a_verified_drift_is_enough():
    host = Host(waits=[dict(PASS, invocation_id=OLD)])
    verified = path(host, drift(changed_files=[])).apply()
    assert host.names() == ["sglang_ready"] and "after_invocation" not in host.calls[0][1]
    assert verified["invocation_id"] == OLD
    host = Host()
    verified = path(host, drift(changed_files=[], in_sync=True, receipt=True, observed={"x": 1})).apply()
    assert host.calls == [] and verified["verdict"] == "pass" and "drift check" in verified["msg"]


def test_a_unit_that_is_not_running_is_started_and_waited_for():
    host = Host(waits=[PASS], systemd_service=[{"changed": True, "status": {"InvocationID": ""}}])
    path(host, drift(changed_files=[], active_state="inactive", invocation_id=None)).apply()
    assert host.names() == ["systemd_service", "sglang_ready"]
    assert host.calls[0][1] == {"name": "sglang.service", "enabled": True, "state": "started"}
    assert "after_invocation" not in host.calls[1][1]
    # systemd_service may report the invocation it started: the wait is past the one the drift check saw
    host = Host(waits=[PASS], systemd_service=[{"changed": True, "status": {"InvocationID": NEW}}])
    path(host, drift(changed_files=[], active_state="failed", invocation_id=OLD)).apply()
    assert host.calls[1][1]["after_invocation"] == OLD


def test_with_verification_off_nothing_is_waited_for_and_nothing_is_kept():
    host = Host(sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "restarted": True, "status": {}}])
    steps = path(host, settings={"sglang_verify": False})
    verified = steps.apply()
    assert verified["verdict"] == "not_verified" and verified["restarted"] is True
    assert steps.save_last_good(verified) == (None, None) and host.names() == ["sglang_unit_files"]


def test_drop_ins_that_override_the_role_stop_everything():
    host = Host()
    with pytest.raises(hp.StepFailed) as failed:
        path(host, drift(blocking=["ExecStart set by drop-in(s) /etc/x.conf"])).apply()
    assert failed.value.step == hp.BLOCKING and "Nothing changed" in failed.value.result["msg"]
    assert host.calls == []


def test_a_failed_wait_is_the_wait_step_with_the_waits_result():
    host = Host(waits=[{"failed": True, "verdict": "mismatch", "msg": "logged 1024"}],
                sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "restarted": True, "status": {}}])
    steps = path(host)
    with pytest.raises(hp.StepFailed) as failed:
        steps.apply()
    assert failed.value.step == hp.WAIT and failed.value.result["verdict"] == "mismatch" and steps.changed


def test_a_lost_connection_is_unreachable():
    host = Host(waits=[{"failed": True, "verdict": "connection_lost", "msg": "gone"}])
    with pytest.raises(hp.StepFailed) as failed:
        path(host, drift(changed_files=[])).apply()
    assert failed.value.result["unreachable"] is True


def test_the_config_file_is_written_from_the_key_and_refused_without_one():
    host = Host(waits=[PASS], sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "restarted": True,
                                                  "status": {}}])
    path(host, drift(changed_files=[CONFIG["path"]]), settings={"sglang_api_key": "k3y"},
         prepared={"config_file": CONFIG}).apply()
    assert host.calls[0][1]["secret_files"] == [dict(CONFIG, content='api-key: "k3y"\n')]
    with pytest.raises(hp.StepFailed) as failed:
        path(Host(), prepared={"config_file": CONFIG}).secret_files()
    assert failed.value.step == hp.INSTALL and "sglang_api_key is empty" in failed.value.result["msg"]


def test_last_good_is_adopted_before_a_first_change_and_saved_only_when_verified():
    host = Host(sglang_last_good=[{"changed": True, "exists": True}])
    steps = path(host, drift(last_good={"exists": False}, observed={"draft_window_size": 1024},
                             config_lines=["line"], source="journal"))
    steps.adopt_last_good()
    adopted = host.calls[0][1]
    assert adopted["state"] == "saved" and adopted["from_process"] is False and adopted["files"] == [UNIT]
    assert adopted["record"]["adopted"] and adopted["record"]["intent"]["expect"] == {"draft_window_size": 1024}
    assert steps.has_last_good()
    # a host that has a copy already, or runs nothing, adopts nothing
    assert path(Host()).adopt_last_good() is None
    assert path(Host(), drift(last_good={"exists": False}, active_state="failed")).adopt_last_good() is None
    host = Host(sglang_last_good=[{"changed": True, "exists": True}])
    saved, error = path(host).save_last_good(PASS)
    assert error is None and host.calls[0][1]["record"]["intent"] == INTENT
    assert path(Host()).save_last_good({"verdict": "unverified"}) == (None, None)
    failing = Host(sglang_last_good=[{"failed": True, "msg": "disk full"}])
    assert path(failing).save_last_good(PASS) == (None, "disk full")


def test_a_revert_restores_restarts_and_waits_with_the_key_of_the_restored_command():
    command = ["py", "-m", "sglang.launch_server", "--config", "/etc/sglang/sglang.yaml"]
    host = Host(waits=[dict(PASS, invocation_id="cccc")], sglang_info=[{"invocation_id": NEW}],
                sglang_last_good=[{"changed": True, "record": {"intent": {"expect": {"x": 1}, "command": command}}}],
                systemd_service=[{"changed": True}])
    steps = path(host, settings={"sglang_api_key": "new-key"})
    outcome = steps.revert()
    assert host.names() == ["sglang_last_good", "sglang_info", "systemd_service", "sglang_ready"]
    wait = host.calls[3][1]
    assert wait["after_invocation"] == NEW and wait["api_key_file"] == "/etc/sglang/sglang.yaml"
    assert "api_key" not in wait and wait["expect"] == {"x": 1}
    assert outcome["healthy"] and steps.reverted_config == "/etc/sglang/sglang.yaml"
    # nothing to restore: no restart, no wait
    host = Host(sglang_info=[{}], sglang_last_good=[{"failed": True, "msg": "no copy"}])
    outcome = path(host).revert()
    assert outcome["verdict"] == "not_restored" and host.names() == ["sglang_last_good", "sglang_info"]


# ------------------------------------------------------------------ the lease

def lease(host, gone=None, clock=None):
    holder = {"kind": "role", "run_id": "role-1", "session": "s1", "generation": None}
    times = iter(clock or [0.0] * 10)
    return hp.Lease(host.run, SETTINGS, holder, lambda: next(times), gone=gone)


def test_the_lease_is_taken_then_renewed_with_its_generation_and_a_takeover_stops_the_step():
    host = Host(sglang_lease=[{"changed": True, "lease": {"generation": 4}}, {"changed": True, "lease": {"generation": 4}},
                              {"failed": True, "action": "refused", "msg": "this run's lease of the host was taken over"}])
    held = lease(host)
    held.hold(record={"step": "applying"}, longer=60)
    assert host.calls[0][1]["seconds"] == 360 and host.calls[0][1]["record"] == {"step": "applying"}
    assert held.held and held.holder["generation"] == 4
    held.hold()
    assert host.calls[1][1]["holder"]["generation"] == 4
    with pytest.raises(hp.StepFailed) as failed:
        held.hold()
    assert failed.value.step == hp.HOLD and "taken over" in failed.value.result["msg"]


def test_a_refusal_by_a_holder_gone_from_this_controller_takes_its_lease_over_once():
    theirs = {"holder": {"run_id": "role-0", "process": {"pid": 1}}, "live": True}
    refused = {"failed": True, "action": "refused", "msg": "the host is leased by role role-0", "lease": theirs}
    host = Host(sglang_lease=[refused, {"changed": True, "lease": {"generation": 2}}])
    held = lease(host, gone=lambda found: found == theirs)
    held.hold()
    assert [args.get("takeover_runs") for name, args in host.calls] == [None, ["role-0"]] and held.held
    # a live holder elsewhere: refused, named, nothing taken over
    host = Host(sglang_lease=[refused])
    with pytest.raises(hp.StepFailed):
        lease(host, gone=lambda found: False).hold()
    assert len(host.calls) == 1


def test_a_wait_renews_the_lease_once_half_of_it_has_passed():
    host = Host(sglang_lease=[{"changed": True, "lease": {"generation": 1}}])
    held = lease(host, clock=[0.0, 90.0, 101.0, 101.0])
    held.hold()
    held.renew_if_due()  # 90 s of 300: not yet
    held.renew_if_due()  # past a third: renewed
    assert len(host.calls) == 2


def test_a_leased_wait_slices_at_most_a_third_of_the_lease_and_renews_between_slices():
    host = Host(waits=[PASS], sglang_lease=[{"changed": True, "lease": {"generation": 1}}])
    held = lease(host)
    the_path = hp.HostPath(host.run, host.wait, dict(SETTINGS, sglang_lease_seconds=15), PREPARED, drift(), host="gpu-1",
                           lease=held)
    held.seconds = 15
    the_path.verified(None)
    wait = [args for name, args in host.calls if name == "sglang_ready"][0]
    assert wait["slice_seconds"] == 5.0


# ------------------------------------------------------------------ a step's record riding on its module


def held_path(host, the_drift=None):
    held = lease(host)
    held.holder["generation"] = 3  # taken earlier (the prepare phase, the role's first step)
    return hp.HostPath(host.run, host.wait, SETTINGS, PREPARED, the_drift or drift(), host="gpu-1", lease=held), held


def test_a_deferred_record_rides_on_the_install_and_no_lease_run_of_its_own_is_made():
    host = Host(waits=[PASS], sglang_unit_files=[{"changed": True, "changed_files": [UNIT], "restarted": True,
                                                  "status": {"InvocationID": OLD}, "lease": {"generation": 3}}])
    the_path, held = held_path(host)
    held.defer({"step": "applying"})
    the_path.apply()
    assert host.names() == ["sglang_unit_files", "sglang_ready"], host.names()
    carried = host.calls[0][1]["lease"]
    assert carried["record"] == {"step": "applying"} and carried["holder"]["generation"] == 3
    assert carried["unit"] == "sglang.service" and carried["directory"] == "/f" and carried["seconds"] == 300
    assert held.pending is None and "lease" not in host.calls[1][1]


def test_a_deferred_record_is_written_by_a_lease_run_before_a_module_that_cannot_carry_it():
    # nothing to install, the unit stopped: the start (systemd_service) carries no lease
    host = Host(waits=[PASS], sglang_lease=[{"changed": True, "lease": {"generation": 3}}],
                systemd_service=[{"changed": True}])
    the_path, held = held_path(host, drift(changed_files=[], active_state="inactive"))
    held.defer({"step": "applying"})
    the_path.apply()
    assert host.names() == ["sglang_lease", "systemd_service", "sglang_ready"], host.names()
    assert host.calls[0][1]["record"] == {"step": "applying"} and "lease" not in host.calls[1][1]
    # nothing at all runs on the host (a running process the drift check verified): the next record writes it first
    host = Host(sglang_lease=[{"changed": True, "lease": {"generation": 3}}])
    the_path, held = held_path(host, drift(changed_files=[], in_sync=True, receipt={"invocation_id": OLD}))
    held.defer({"step": "applying"})
    the_path.apply()
    held.hold(record={"step": "verified"})
    assert [args["record"]["step"] for name, args in host.calls] == ["applying", "verified"]


def test_a_rider_refused_by_a_lease_taken_over_fails_the_step_as_the_lease_and_keeps_the_record_pending():
    refused = {"failed": True, "action": "refused", "changed": False, "msg": "taken over by sweep sw-2"}
    host = Host(sglang_unit_files=[refused])
    the_path, held = held_path(host)
    held.defer({"step": "applying"})
    with pytest.raises(hp.StepFailed) as failed:
        the_path.apply()
    assert failed.value.step == hp.HOLD and "sw-2" in failed.value.result["msg"] and not the_path.changed
    assert held.pending == {"step": "applying"}  # it never reached the host
    held.discard()
    assert held.pending is None
    # an unreachable host: the module never ran, the record is still to be written
    host = Host(sglang_unit_files=[{"unreachable": True, "msg": "ssh: connection refused"}])
    the_path, held = held_path(host)
    held.defer({"step": "applying"})
    with pytest.raises(hp.StepFailed) as failed:
        the_path.apply()
    assert failed.value.step == hp.INSTALL and held.pending == {"step": "applying"}


def test_a_lease_not_yet_taken_is_taken_at_once_when_a_record_is_deferred_and_a_release_supersedes_one():
    host = Host(sglang_lease=[{"changed": True, "lease": {"generation": 5}}])
    held = lease(host)
    held.defer({"step": "applying"}, intent_digest="d1")
    assert host.calls[0][1]["record"] == {"step": "applying"} and host.calls[0][1]["intent_digest"] == "d1"
    assert held.held and held.pending is None
    held.defer({"step": "saving"})
    held.release(record={"step": "done"})
    assert [args.get("record") for name, args in host.calls] == [{"step": "applying"}, {"step": "done"}]
    assert host.calls[1][1]["state"] == "released" and held.pending is None
