# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's comparison in one action: validate before the host is asked anything, the version
from the host, the intent and the rendered unit for THAT version, the drift check with them, and
the host's own SGLang checking the arguments only when the host must change. Each failure stops
what follows it. The host's modules are scripted; the role's variables come as task variables."""
import pytest

from ansible_collections.gpufleet.inference.plugins.action import sglang_compare as action_mod
from ansible_collections.gpufleet.inference.plugins.module_utils import _args

import fakes

SETTINGS = {
    "sglang_unit_name": "sglang.service", "sglang_python": "/opt/sglang/venv/bin/python",
    "sglang_config_file": "/etc/sglang/sglang.yaml", "sglang_user": "sglang", "sglang_group": "sglang",
    "sglang_model_path": "/models/Kimi-K2.6", "sglang_served_model_name": "kimi-k2.6", "sglang_tp_size": 8,
    "sglang_host": "0.0.0.0", "sglang_port": 30000, "sglang_api_key": "", "sglang_extra_args": {},
    "sglang_environment": {"SGLANG_SIM_LOAD_SECONDS": "4"},
    "sglang_speculative_algorithm": "DFLASH", "sglang_speculative_draft_model_path": "/models/Kimi-K2.6-DFlash",
    "sglang_speculative_num_draft_tokens": 16, "sglang_speculative_draft_window_size": 2048,
    "sglang_speculative_eagle_topk": None, "sglang_speculative_num_steps": None,
    "sglang_speculative_tree_budget": None, "sglang_restart": "on-failure", "sglang_restart_sec": 10,
    "sglang_timeout_start_sec": 900, "sglang_timeout_stop_sec": 900, "sglang_journal_rate_limit_burst": 100000,
    "sglang_journal_rate_limit_interval": "30s",
}
# The role's other variables the comparison reads (their defaults).
CHECKS = {"sglang_version": "", "sglang_router_worker_url": "", "sglang_receipt_dir": "/var/lib/r",
          "sglang_last_good_dir": "/var/lib/l", "sglang_fleet_dir": "/var/lib/f", "sglang_probe_prompt": "The capital of France is",
          "sglang_probe_max_new_tokens": 16}
UNIT = "/etc/systemd/system/sglang.service"
JOURNALD = "/etc/systemd/journald.conf.d/50-gpufleet-sglang.conf"
DRIFTED = {"changed": False, "verdict": "drifted", "in_sync": False, "changed_files": [UNIT], "invocation_id": "aaaa"}
IN_SYNC = {"changed": False, "verdict": "in_sync", "in_sync": True, "changed_files": [], "invocation_id": "aaaa"}


class Host(object):
    """_execute_module: answers per module (short name) in order; records every call."""

    def __init__(self, **answers):
        self.answers = dict((name, list(items)) for name, items in answers.items())
        self.calls = []

    def __call__(self, module_name, module_args, task_vars):
        name = module_name.rsplit(".", 1)[-1]
        self.calls.append((name, dict(module_args)))
        queue = self.answers.get(name) or [{"changed": False}]
        return dict(queue.pop(0) if len(queue) > 1 else queue[0])

    def names(self):
        return [name for name, dummy in self.calls]


def compare(host, settings=None, commands=None, preflight=True, **over):
    """The action with `host`'s modules and the role's variables (`settings`, then `over` by variable name); with
    `commands` (a Commands), through a pipelining connection whose commands it answers, else the module path."""
    task_vars = dict(CHECKS, **dict(settings or SETTINGS))
    task_vars.update(inventory_hostname="gpu-1", ansible_host="10.0.0.7")
    task_vars.update(over)
    action = fakes.make_action(action_mod, {"preflight": preflight}, action="gpufleet.inference.sglang_compare")
    action._execute_module = host
    action._is_pipelining_enabled = lambda *a, **k: commands is not None
    if commands is not None:
        action._low_level_execute_command = commands
    return action.run(task_vars=task_vars)


def test_a_host_that_must_change_is_compared_with_its_versions_intent_then_its_sglang_checks_the_arguments():
    host = Host(sglang_preflight=[{"changed": False, "version": "0.5.23", "version_source": "metadata"},
                                  {"changed": False, "version": "0.5.23", "checked": ["parse"], "unchecked": []}],
                sglang_drift=[DRIFTED])
    out = compare(host)
    assert not out.get("failed"), out
    assert host.names() == ["sglang_preflight", "sglang_drift", "sglang_preflight"]
    intent = _args.build_intent(SETTINGS, "0.5.23")
    assert host.calls[0][1] == {"python": "/opt/sglang/venv/bin/python",
                                "environment": {"SGLANG_SIM_LOAD_SECONDS": "4"}}  # version only: no args
    drift_args = host.calls[1][1]
    assert (drift_args["expect"], drift_args["command"], drift_args["config_line"]) == (
        intent["expect"], intent["command"], intent["config_line"])
    assert drift_args["server_info"] == _args.intended_server_info(SETTINGS, "0.5.23")
    # The files compared are the unit and drop-in rendered for the DETECTED version.
    unit_text = _args.render_unit(SETTINGS, "0.5.23")
    assert [(f["path"], f["content"]) for f in drift_args["files"]] == [
        (UNIT, unit_text), (JOURNALD, _args.render_journald(SETTINGS))]
    assert "--speculative-draft-window-size" in unit_text  # 0.5.23's flag
    assert drift_args["files"][1]["restart_on_change"] is False
    assert drift_args["url"] == "http://127.0.0.1:30000" and "api_key" not in drift_args
    assert drift_args["accounts"] == {"user": "sglang", "group": "sglang"}
    assert host.calls[2][1]["args"] == intent["command"][3:]
    # The drift result is the task's result (register: sglang_drift), plus what later steps use.
    assert out["verdict"] == "drifted" and out["changed_files"] == [UNIT] and out["changed"] is False
    assert out["prepared"]["version"] == "0.5.23" and out["prepared"]["intent"] == intent
    assert out["prepared"]["endpoint"] == {"url": "http://127.0.0.1:30000", "worker_url": "http://10.0.0.7:30000"}
    assert out["prepared"]["unit_text"] == unit_text
    assert out["ansible_facts"] == {"sglang_endpoint": out["prepared"]["endpoint"]}
    assert out["preflight"] == {"checked": ["parse"], "unchecked": []}


def test_a_host_in_sync_is_not_checked_again_and_a_given_version_is_not_detected():
    host = Host(sglang_drift=[IN_SYNC])
    out = compare(host, sglang_version="0.5.11", sglang_router_worker_url="http://gpu-1.lb:30000")
    assert not out.get("failed"), out
    assert host.names() == ["sglang_drift"]
    assert "--speculative-dflash-draft-window-size" in out["prepared"]["unit_text"]  # 0.5.11's flag
    assert host.calls[0][1]["command"] == _args.build_intent(SETTINGS, "0.5.11")["command"]
    assert out["prepared"]["endpoint"]["worker_url"] == "http://gpu-1.lb:30000"
    assert out["prepared"]["version_source"] == "sglang_version" and "preflight" not in out


def test_preflight_false_never_checks_the_arguments():
    host = Host(sglang_drift=[DRIFTED])
    assert not compare(host, sglang_version="0.5.23", preflight=False).get("failed")
    assert host.names() == ["sglang_drift"]


@pytest.mark.parametrize("over,message", [
    ({"sglang_speculative_draft_window_size": 8}, "sglang_speculative_draft_window_size (8) must be >="),
    ({"sglang_tp_size": -2}, "sglang_tp_size must be a positive integer"),
    ({"sglang_extra_args": {"mem-fraction-static": 0.8}}, "is not a --flag"),
])
def test_invalid_settings_fail_before_the_host_is_asked_anything(over, message):
    host = Host()
    out = compare(host, settings=dict(SETTINGS, **over))
    assert out["failed"] and message in out["msg"] and out["step"] == "validate", out
    assert "nothing on the host was asked or changed" in out["msg"] and host.calls == []


def test_no_sglang_on_the_host_stops_before_the_comparison():
    host = Host(sglang_preflight=[{"failed": True, "msg": "cannot tell which SGLang /opt/x has"}])
    out = compare(host)
    assert out["failed"] and out["step"] == "version" and "cannot tell which SGLang" in out["msg"], out
    assert host.names() == ["sglang_preflight"]


def test_a_version_without_the_intended_settings_fails_naming_it_before_the_comparison():
    host = Host(sglang_preflight=[{"changed": False, "version": "0.5.10", "version_source": "metadata"}])
    out = compare(host)
    assert out["failed"] and out["step"] == "intent" and "0.5.11" in out["msg"], out
    assert host.names() == ["sglang_preflight"]


def test_arguments_the_hosts_sglang_rejects_fail_the_host_after_the_comparison():
    host = Host(sglang_preflight=[{"version": "0.5.23"},
                                  {"failed": True, "msg": "SGLang 0.5.23 (/opt/x) rejects the intended arguments"}],
                sglang_drift=[DRIFTED])
    out = compare(host)
    assert out["failed"] and out["step"] == "preflight" and "rejects the intended arguments" in out["msg"], out
    assert out["verdict"] == "drifted" and "unreachable" not in out  # the comparison stays in the result


def test_a_lost_host_is_unreachable_and_nothing_follows():
    host = Host(sglang_drift=[{"unreachable": True, "msg": "ssh: connect to host refused"}])
    out = compare(host, sglang_version="0.5.23")
    assert out["unreachable"] and out["failed"] and out["step"] == "drift", out
    assert host.names() == ["sglang_drift"]


def test_the_api_key_goes_to_the_drift_check_and_nowhere_in_the_result():
    host = Host(sglang_drift=[IN_SYNC])
    out = compare(host, settings=dict(SETTINGS, sglang_api_key="k3y-s3cret"), sglang_version="0.5.23")
    drift_args = host.calls[0][1]
    config = {"path": "/etc/sglang/sglang.yaml", "mode": "0640", "owner": "root", "group": "sglang"}
    assert drift_args["api_key"] == "k3y-s3cret"
    assert drift_args["secret_files"] == [dict(config, content='api-key: "k3y-s3cret"\n')]
    assert "k3y-s3cret" not in repr(out)
    assert "--api-key" not in drift_args["command"]
    # only the config file's place is prepared, never its content
    assert out["prepared"]["config_file"] == config
    assert out["prepared"]["unit_files"] == [UNIT, "/etc/sglang/sglang.yaml"]
    assert out["prepared"]["paths"] == {"unit": UNIT, "journald": JOURNALD}
    # no API key: no config file, and only the unit is kept as last-known-good
    host = Host(sglang_drift=[IN_SYNC])
    out = compare(host, sglang_version="0.5.23")
    assert host.calls[0][1]["secret_files"] == []
    assert out["prepared"]["config_file"] is None and out["prepared"]["unit_files"] == [UNIT]


def test_outside_the_role_its_variables_are_missing_and_named():
    settings = dict(SETTINGS)
    del settings["sglang_python"]
    with pytest.raises(Exception, match="undefined: sglang_python"):
        compare(Host(), settings=settings)


def test_a_host_lost_during_the_argument_check_is_unreachable():
    host = Host(sglang_preflight=[{"unreachable": True, "msg": "ssh: connection reset"}], sglang_drift=[DRIFTED])
    out = compare(host, sglang_version="0.5.23")
    assert out["failed"] and out["unreachable"] and out["step"] == "preflight", out
    assert host.names() == ["sglang_drift", "sglang_preflight"]


# ------------------------------------------------------------------ the preflight as commands (pipelining)

class Commands(object):
    """_low_level_execute_command on a pipelining connection: runs the bootstrap's input (argv, environment)
    against scripted answers per script (version, check); records command lines and inputs."""

    def __init__(self, version=None, check=None, lost=None):
        import json as _json
        self._json = _json
        self.answers = {"version": version, "check": check}
        self.lost = lost
        self.commands, self.inputs = [], []

    def __call__(self, cmd, sudoable=True, in_data=None, **kwargs):
        from ansible.errors import AnsibleConnectionFailure
        if self.lost:
            raise AnsibleConnectionFailure(self.lost)
        self.commands.append(cmd)
        data = self._json.loads(in_data)
        self.inputs.append(data)
        script = "version" if data["args"][1] == action_mod._preflight.VERSION_SCRIPT else "check"
        rc, out, err = self.answers[script]
        return {"rc": rc, "stdout": out, "stderr": err}

    def scripts(self):
        return ["version" if data["args"][1] == action_mod._preflight.VERSION_SCRIPT else "check"
                for data in self.inputs]


def report(data):
    import json
    return "noise\n%s %s\n" % (action_mod._preflight.MARKER, json.dumps(data))


VERSION_0523 = (0, report({"version": "0.5.23", "source": "metadata", "error": None}), "")
CHECK_OK = (0, report({"ok": True, "stage": "resolve", "error": None, "exception": None, "checked": ["parse"],
                       "unchecked": []}), "")


def compare_by_commands(host, commands, settings=None, **over):
    return compare(host, settings=settings, commands=commands, **over)


def test_with_pipelining_the_preflight_runs_as_commands_and_no_preflight_module_is_sent():
    host = Host(sglang_drift=[DRIFTED])
    commands = Commands(version=VERSION_0523, check=CHECK_OK)
    settings = dict(SETTINGS, sglang_environment={"HF_TOKEN": "hf-secret-1", "NCCL_DEBUG": "WARN"})
    out = compare_by_commands(host, commands, settings=settings)
    assert not out.get("failed"), out
    assert host.names() == ["sglang_drift"]  # the drift module only
    assert commands.scripts() == ["version", "check"]
    assert out["prepared"]["version"] == "0.5.23" and out["prepared"]["version_source"] == "metadata"
    assert out["preflight"] == {"checked": ["parse"], "unchecked": []}
    # The command line is the interpreter and the bootstrap: the environment and the arguments come on stdin.
    python = SETTINGS["sglang_python"]
    for cmd in commands.commands:
        assert cmd.startswith(python + " -c ") and "hf-secret-1" not in cmd and "NCCL_DEBUG" not in cmd
    for data in commands.inputs:
        assert data["env"]["HF_TOKEN"] == "hf-secret-1" and data["env"]["LC_ALL"] == "C"
    intent = _args.build_intent(settings, "0.5.23")
    assert commands.inputs[1]["args"][2:] == action_mod._preflight.without_config(intent["command"][3:])


def test_with_pipelining_a_host_in_sync_runs_only_the_version_command():
    commands = Commands(version=VERSION_0523)
    out = compare_by_commands(Host(sglang_drift=[IN_SYNC]), commands)
    assert not out.get("failed") and "preflight" not in out and commands.scripts() == ["version"], out


def test_with_pipelining_an_interpreter_that_is_not_there_fails_naming_it_and_nothing_else_runs():
    host = Host()
    commands = Commands(version=(127, "", "/bin/sh: 1: /opt/sglang/venv/bin/python: not found"))
    out = compare_by_commands(host, commands)
    assert out["failed"] and out["step"] == "version", out
    assert out["msg"] == ("cannot tell which SGLang /opt/sglang/venv/bin/python (sglang_python) has: /bin/sh: 1: "
                          "/opt/sglang/venv/bin/python: not found (exit 127). Point sglang_python at the interpreter "
                          "that has sglang installed, or set sglang_version.")
    assert host.calls == []


def test_with_pipelining_arguments_sglang_rejects_fail_the_host_at_preflight():
    check = (1, report({"ok": False, "stage": "parse", "exception": "SystemExit", "checked": [], "unchecked": [],
                        "error": "argument --tp-size: invalid int value: 'eight'"}), "")
    out = compare_by_commands(Host(sglang_drift=[DRIFTED]), Commands(version=VERSION_0523, check=check))
    assert out["failed"] and out["step"] == "preflight", out
    assert "rejects the intended arguments (parse): argument --tp-size: invalid int value" in out["msg"]


def test_with_pipelining_a_lost_connection_is_unreachable():
    out = compare_by_commands(Host(), Commands(lost="ssh: connect to host 10.0.0.7 port 22: Connection refused"))
    assert out["failed"] and out["unreachable"] and out["step"] == "version", out


def test_without_pipelining_the_preflight_module_runs():
    host = Host(sglang_preflight=[{"changed": False, "version": "0.5.23", "version_source": "metadata"}],
                sglang_drift=[IN_SYNC])
    commands = Commands(version=VERSION_0523)
    action = fakes.make_action(action_mod, {}, action="gpufleet.inference.sglang_compare")
    action._execute_module = host
    action._connection.is_pipelining_enabled = lambda *a, **k: False  # what _is_pipelining_enabled asks
    action._low_level_execute_command = commands
    out = action.run(task_vars=dict(CHECKS, inventory_hostname="gpu-1", **SETTINGS))
    assert not out.get("failed") and host.names() == ["sglang_preflight", "sglang_drift"] and commands.inputs == []


# ------------------------------------------------------------------ a node of a serving group

def group_vars(**node_changes):
    """hostvars and groups of a 2-node serving group (gpu-1 the head at 10.0.0.7, gpu-2 its follower)."""
    common = dict(SETTINGS, group_names=["gpu", "k26_2node"], sglang_serving_groups=["k26_2node"],
                  sglang_tp_size=16, sglang_host="0.0.0.0")
    hostvars = {"gpu-1": dict(common, sglang_node_rank=0, ansible_host="10.0.0.7"),
                "gpu-2": dict(dict(common, sglang_node_rank=1, ansible_host="10.0.0.8"), **node_changes)}
    return {"hostvars": hostvars, "groups": {"all": ["gpu-1", "gpu-2"], "k26_2node": ["gpu-1", "gpu-2"]}}


def test_a_follower_is_compared_with_its_nodes_flags_and_nothing_of_a_server():
    host = Host(sglang_drift=[IN_SYNC])
    out = compare(host, sglang_version="0.5.23", sglang_tp_size=16, inventory_hostname="gpu-2", **group_vars())
    assert not out.get("failed"), out
    node = ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.7:50000"]
    settings = dict(SETTINGS, sglang_tp_size=16)
    drift_args = host.calls[0][1]
    assert drift_args["command"] == _args.build_command(settings, "0.5.23", node)
    assert drift_args["probe"] is False and drift_args["server_info"] is None
    assert (drift_args["expect"], drift_args["config_line"]) == ({}, "optional")
    assert out["prepared"]["intent"]["follower"] is True and "KillMode=mixed" in out["prepared"]["unit_text"]
    assert out["prepared"]["group"]["rank"] == 1 and out["prepared"]["group"]["head"] == "gpu-1"


def test_the_head_is_compared_with_the_full_contract_and_its_nodes_flags():
    host = Host(sglang_drift=[IN_SYNC])
    out = compare(host, sglang_version="0.5.23", sglang_tp_size=16, **group_vars())
    drift_args = host.calls[0][1]
    assert drift_args["probe"] is True and drift_args["config_line"] == "required"
    assert drift_args["command"][-6:] == ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.0.0.7:50000"]
    assert out["prepared"]["group"]["rank"] == 0


def test_a_serving_group_the_inventory_gets_wrong_fails_naming_host_and_variable_before_the_host_is_asked():
    host = Host()
    out = compare(host, sglang_tp_size=16, **group_vars(sglang_node_rank=2))
    assert out["failed"] and out["step"] == "validate" and host.calls == []
    assert "gpu-1: serving group: host gpu-2: sglang_node_rank 2 is out of range" in out["msg"]
    assert "nothing on the host was asked or changed" in out["msg"]
