# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A serving group's path: every node's host path in SGLang's order (install everywhere, stop head first, start
followers first and all at once, the head's full wait with its followers looked at between its slices, then each
follower's own), a failure that names the node that caused it, a revert of every node as one.

Each node's modules and waits are scripted; one log keeps the order across the nodes."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _grouppath as gp
from ansible_collections.gpufleet.inference.plugins.module_utils import _hostpath as hp

from fakes import NEW, OLD
from test_hostpath import PASS, PREPARED, SETTINGS, UNIT, drift

GROUP = {"name": "k26_2node", "head": "gpu-c01", "followers": ["gpu-c02"], "ranks": {"gpu-c01": 0, "gpu-c02": 1},
         "nnodes": 2}
FOLLOWER_INTENT = {"expect": {}, "config_line": "optional", "command": ["py", "-m", "sglang", "--node-rank", "1"],
                   "environment": {}, "follower": True}
FOLLOWER_PASS = {"verdict": "pass", "verified": True, "invocation_id": "f-new", "msg": "joined its serving group"}
WAITING = {"verdict": "waiting", "state": {"tracker": {"invocation_id": "f-new"}}, "phase": "loading weights"}


class Node(object):
    """One node's scripted modules (per short name, in order) and waits, logged in the group's one log."""

    def __init__(self, host, log, waits=(), **answers):
        self.host, self.log = host, log
        self.answers = dict((name, list(items)) for name, items in answers.items())
        self.waits = list(waits)

    def run(self, name, args):
        short = name.rsplit(".", 1)[-1]
        self.log.append((self.host, short, dict(args)))
        queue = self.answers.get(short) or [{"changed": False}]
        return dict(queue.pop(0) if len(queue) > 1 else queue[0])

    def wait(self, args, between=None):
        self.log.append((self.host, "wait", dict(args)))
        if between is not None:
            between()  # one slice of this wait ended
        return dict(self.waits.pop(0) if len(self.waits) > 1 else self.waits[0])


def group(head=None, follower=None, settings=None, head_drift=None, follower_drift=None):
    """(GroupPath, log): gpu-c01 (head) and gpu-c02 (follower), each with its scripted node."""
    log = []
    # unless told otherwise, the follower's unit differs (the install writes it) and the head's is in sync
    follower = dict({"sglang_unit_files": [{"changed": True, "changed_files": [UNIT]}]}, **(follower or {}))
    nodes = {"gpu-c01": Node("gpu-c01", log, **(head or {})), "gpu-c02": Node("gpu-c02", log, **follower)}
    prepared = {"gpu-c01": PREPARED, "gpu-c02": dict(PREPARED, intent=FOLLOWER_INTENT)}
    drifts = {"gpu-c01": head_drift or drift(), "gpu-c02": follower_drift or drift(invocation_id="f-old")}
    paths = dict((host, hp.HostPath(node.run, node.wait, dict(SETTINGS, **(settings or {})), prepared[host],
                                    drifts[host], host=host)) for host, node in nodes.items())
    return gp.GroupPath(GROUP, paths), log


def steps(log):
    """(host, what) of the log, a systemd call named by its state."""
    return [(host, args.get("state") if name == "systemd_service" else name) for host, name, args in log]


STOPPED = {"changed": True, "status": {"InvocationID": OLD}}
STOPPED_FOLLOWER = {"changed": True, "status": {"InvocationID": "f-old"}}


def test_a_follower_that_must_change_restarts_the_group_head_first_then_followers_first_then_waits_for_all():
    path, log = group(head={"waits": [PASS], "systemd_service": [STOPPED, {"changed": True}]},
                      follower={"waits": [FOLLOWER_PASS], "sglang_ready": [WAITING],
                                "systemd_service": [STOPPED_FOLLOWER, {"changed": True}]},
                      head_drift=drift(changed_files=[], in_sync=True))
    verified = path.apply()
    assert steps(log) == [("gpu-c02", "sglang_unit_files"),
                          ("gpu-c01", "stopped"), ("gpu-c02", "stopped"),  # head first
                          ("gpu-c02", "started"), ("gpu-c01", "started"),  # followers first, nobody waited for
                          ("gpu-c01", "wait"), ("gpu-c02", "sglang_ready"),  # a follower looked at between slices
                          ("gpu-c02", "wait")]
    install = log[0][2]
    assert "restart" not in install  # installed everywhere first, nothing restarted by the install
    start = [args for host, name, args in log if args.get("state") == "started"][0]
    assert start["no_block"] is True and start["daemon_reload"] is True and start["enabled"] is True
    head_wait = [args for host, name, args in log if name == "wait"][0]
    assert head_wait["after_invocation"] == OLD and head_wait["slice_seconds"] <= gp.WATCH_SECONDS
    look = [args for host, name, args in log if name == "sglang_ready"][0]
    assert look["follower"] is True and look["after_invocation"] == "f-old" and look["slice_seconds"] == gp.LOOK_SECONDS
    follower_wait = [args for host, name, args in log if name == "wait"][1]
    assert follower_wait["follower"] is True and follower_wait["after_invocation"] == "f-old"
    assert verified["invocation_id"] == NEW and verified["group"] == "k26_2node"
    assert verified["nodes"]["gpu-c02"]["invocation_id"] == "f-new" and verified["nodes"]["gpu-c01"] is not None
    assert path.changed


def test_a_unit_that_never_ran_counts_any_invocation_as_new():
    path, log = group(head={"waits": [PASS], "systemd_service": [{"changed": False, "status": {}}]},
                      follower={"waits": [FOLLOWER_PASS], "systemd_service": [{"changed": False, "status": {}}]},
                      head_drift=drift(invocation_id=None), follower_drift=drift(invocation_id=None))
    path.apply()
    waits = [args for host, name, args in log if name == "wait"]
    assert [args["after_invocation"] for args in waits] == [gp.NO_INVOCATION, gp.NO_INVOCATION]


def test_a_group_in_sync_restarts_nothing_and_verifies_every_node_running():
    in_sync = drift(changed_files=[], in_sync=True)
    path, log = group(head={"waits": [PASS]}, follower={"waits": [FOLLOWER_PASS], "sglang_unit_files": [{}]},
                      head_drift=in_sync, follower_drift=dict(in_sync, invocation_id="f-old"))
    verified = path.apply()
    assert steps(log) == [("gpu-c01", "wait"), ("gpu-c02", "wait")]
    assert "after_invocation" not in log[0][2] and log[1][2]["follower"] is True
    assert verified["nodes"]["gpu-c02"]["verdict"] == "pass" and not path.changed


def test_a_node_not_running_restarts_the_group():
    in_sync = drift(changed_files=[], in_sync=True)
    path, log = group(head={"waits": [PASS]}, follower={"waits": [FOLLOWER_PASS], "sglang_unit_files": [{}]},
                      head_drift=in_sync, follower_drift=dict(in_sync, active_state="inactive"))
    path.apply()
    assert ("gpu-c01", "stopped") in steps(log) and ("gpu-c02", "started") in steps(log)


def test_a_follower_that_dies_while_the_head_loads_fails_the_group_at_once_naming_it_with_its_tail():
    died = {"verdict": "died", "failed": True, "msg": "sglang.service: invocation f-new ended (code=killed)\n"
            "Last 2 journal lines of the invocation:\nScheduler hit an exception: CUDA error\nReceived sigquit"}
    path, log = group(head={"waits": [PASS]}, follower={"sglang_ready": [died]})
    with pytest.raises(hp.StepFailed) as caught:
        path.apply()
    failure = caught.value.result
    assert caught.value.step == gp.WAIT_GROUP and failure["node"] == "gpu-c02" and failure["verdict"] == "died"
    assert failure["msg"].startswith("serving group k26_2node: node gpu-c02 (rank 1) failed, so the group cannot serve:")
    assert "Scheduler hit an exception: CUDA error" in failure["msg"]
    assert ("gpu-c02", "wait") not in steps(log)  # no wait of its own after that


def test_a_head_that_died_because_its_follower_died_names_the_follower_first():
    head_died = {"verdict": "died", "failed": True, "msg": "sglang.service: invocation h ended: Connection closed by "
                 "peer [127.0.17.12]:41000\nLast lines..."}
    crash = {"verdict": "crash_loop", "failed": True, "msg": "sglang.service: invocation f-new exited (crash loop)\n"
             "Last lines: Scheduler hit an exception"}
    path, log = group(head={"waits": [head_died]}, follower={"sglang_ready": [crash]})
    path.head.wait = lambda args, between=None: dict(head_died)  # the head's wait ends before any look
    with pytest.raises(hp.StepFailed) as caught:
        path.apply()
    failure = caught.value.result
    assert failure["node"] == "gpu-c02"
    assert "node gpu-c02 (rank 1) failed, so the group cannot serve: sglang.service: invocation f-new exited" in \
        failure["msg"]
    assert "Its head gpu-c01 failed with it: sglang.service: invocation h ended: Connection closed by peer" in \
        failure["msg"]


def test_a_head_that_times_out_names_the_rank_that_never_joined_and_where_it_waits():
    timeout = {"verdict": "timeout", "failed": True, "msg": "timed out after 30.0s waiting for sglang.service: last "
               "phase: distributed init (waiting for every rank to join); port not open yet"}
    stuck = dict(WAITING, phase="starting; not joined its serving group yet",
                 unit_state={"active_state": "activating", "sub_state": "start-pre"})
    path, log = group(head={"waits": [timeout]}, follower={"sglang_ready": [stuck]})
    with pytest.raises(hp.StepFailed) as caught:
        path.apply()
    failure = caught.value.result
    assert failure["node"] == "gpu-c02" and failure["verdict"] == "timeout"
    assert failure["msg"].startswith("serving group k26_2node did not come up: its head gpu-c01 waited for rank 1 "
                                     "(gpu-c02), which has not joined the group - rank 1 (gpu-c02): starting; not "
                                     "joined its serving group yet (unit activating/start-pre)")
    assert "Its head: timed out after 30.0s" in failure["msg"]


def test_a_head_that_sglang_ended_at_its_dist_timeout_names_the_rank_that_never_joined():
    died = {"verdict": "crash_loop", "failed": True, "msg": "sglang.service: invocation h exited: Cause: "
            "torch.distributed.DistStoreError: Timed out after 61 seconds waiting for clients. 1/2 clients joined."}
    path, log = group(head={"waits": [died]}, follower={"sglang_ready": [dict(WAITING, phase="starting")]})
    with pytest.raises(hp.StepFailed) as caught:
        path.apply()
    assert "waited for rank 1 (gpu-c02), which has not joined the group" in caught.value.result["msg"]
    assert "1/2 clients joined" in caught.value.result["msg"]


def test_a_head_that_fails_on_its_own_is_named():
    mismatch = {"verdict": "mismatch", "failed": True, "msg": "sglang.service runs other settings than intended"}
    path, log = group(head={"waits": [mismatch]}, follower={"sglang_ready": [WAITING]})
    with pytest.raises(hp.StepFailed) as caught:
        path.apply()
    assert caught.value.result["node"] == "gpu-c01"
    assert caught.value.result["msg"] == ("serving group k26_2node: its head gpu-c01 failed (its followers had not): "
                                          "sglang.service runs other settings than intended")


def test_a_follower_that_fails_its_own_verification_after_the_head_passed_fails_the_group_naming_it():
    replaced = {"verdict": "replaced", "failed": True, "msg": "sglang.service: invocation f-new was replaced"}
    path, log = group(head={"waits": [PASS]}, follower={"waits": [replaced], "sglang_ready": [WAITING]})
    with pytest.raises(hp.StepFailed) as caught:
        path.apply()
    assert caught.value.result["node"] == "gpu-c02" and "node gpu-c02 (rank 1) failed" in caught.value.result["msg"]


def test_a_look_lost_to_the_connection_is_no_verdict():
    path, log = group(head={"waits": [PASS]},
                      follower={"waits": [FOLLOWER_PASS], "sglang_ready": [{"unreachable": True, "msg": "ssh"}]})
    verified = path.apply()
    assert verified["nodes"]["gpu-c02"]["verdict"] == "pass"


def test_verification_off_restarts_and_verifies_no_node():
    path, log = group(head={"waits": [PASS]}, follower={"waits": [FOLLOWER_PASS]}, settings={"sglang_verify": False})
    verified = path.apply()
    assert "wait" not in [name for host, name, args in log]
    assert verified["verdict"] == "not_verified" and verified["nodes"]["gpu-c02"]["restarted"] is True


def test_every_node_keeps_its_own_verified_unit_as_last_known_good():
    path, log = group(head={"waits": [PASS]}, follower={"waits": [FOLLOWER_PASS]})
    verified = path.apply()
    saved, error = path.save_last_good(verified)
    kept = dict((host, args) for host, name, args in log if name == "sglang_last_good")
    assert kept["gpu-c01"]["record"]["invocation_id"] == NEW and kept["gpu-c02"]["record"]["invocation_id"] == "f-new"
    assert kept["gpu-c02"]["record"]["intent"] == FOLLOWER_INTENT and error is None


def test_adopt_and_has_last_good_ask_every_node():
    path, log = group(follower_drift=drift(last_good={"exists": False}, invocation_id="f-old"))
    assert not path.has_last_good()
    path.adopt_last_good()
    assert [host for host, name, args in log if name == "sglang_last_good"] == ["gpu-c02"]


def restored(intent, config=None):
    command = intent["command"] + (["--config", config] if config else [])
    return {"changed": True, "changed_files": [UNIT], "record": {"intent": dict(intent, command=command)}}


def test_a_revert_restores_every_node_and_restarts_the_group_as_one_held_to_what_each_recorded():
    head_intent = dict(PREPARED["intent"])
    adopted = {"expect": {}, "config_line": "optional", "command": ["py", "-m", "sglang"], "environment": {}}
    path, log = group(head={"waits": [PASS], "sglang_info": [{"invocation_id": "bad-h"}],
                            "sglang_last_good": [restored(head_intent, "/etc/sglang/sglang.yaml")],
                            "systemd_service": [{"status": {"InvocationID": "bad-h"}}, {}]},
                      follower={"waits": [FOLLOWER_PASS], "sglang_ready": [WAITING],
                                "sglang_info": [{"invocation_id": "bad-f"}],
                                "sglang_last_good": [restored(adopted)],
                                "systemd_service": [{"status": {}}, {}]})
    outcome = path.revert()
    assert [step for step in steps(log) if step[1] in ("sglang_last_good", "stopped", "started")] == [
        ("gpu-c01", "sglang_last_good"), ("gpu-c02", "sglang_last_good"), ("gpu-c01", "stopped"),
        ("gpu-c02", "stopped"), ("gpu-c02", "started"), ("gpu-c01", "started")]
    waits = dict((host, args) for host, name, args in log if name == "wait")
    assert waits["gpu-c01"]["api_key_file"] == "/etc/sglang/sglang.yaml" and waits["gpu-c01"]["after_invocation"] == "bad-h"
    assert waits["gpu-c02"]["follower"] is True and waits["gpu-c02"]["after_invocation"] == "bad-f"
    assert outcome["healthy"] and outcome["group"] == "k26_2node" and outcome["verdict"] == "pass"
    assert outcome["nodes"]["gpu-c02"]["healthy"] and path.reverted_config == "/etc/sglang/sglang.yaml"


def test_a_revert_whose_files_cannot_all_be_put_back_restarts_nothing():
    path, log = group(head={"sglang_last_good": [restored(PREPARED["intent"])]},
                      follower={"sglang_last_good": [{"failed": True, "msg": "no copy kept"}]})
    outcome = path.revert()
    assert not outcome["healthy"] and outcome["verdict"] == "not_restored" and "gpu-c02" in outcome["msg"]
    assert not [step for step in steps(log) if step[1] in ("stopped", "started", "wait")]


def test_a_revert_whose_group_fails_again_is_unhealthy_naming_the_node():
    died = {"verdict": "died", "failed": True, "msg": "invocation f ended"}
    path, log = group(head={"waits": [PASS], "sglang_last_good": [restored(PREPARED["intent"])]},
                      follower={"sglang_ready": [died], "sglang_last_good": [restored(FOLLOWER_INTENT)]})
    outcome = path.revert()
    assert not outcome["healthy"] and outcome["nodes"]["gpu-c02"]["verdict"] == "died"
    assert "node gpu-c02 (rank 1) failed" in outcome["nodes"]["gpu-c02"]["msg"]


def test_a_revert_whose_restart_fails_says_so():
    path, log = group(head={"sglang_last_good": [restored(PREPARED["intent"])],
                            "systemd_service": [{"failed": True, "msg": "Unit sglang.service is masked."}]},
                      follower={"sglang_last_good": [restored(FOLLOWER_INTENT)]})
    outcome = path.revert()
    assert outcome["verdict"] == "restart_failed" and "masked" in outcome["msg"] and not outcome["healthy"]
