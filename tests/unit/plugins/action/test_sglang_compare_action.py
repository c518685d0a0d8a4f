# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's comparison in one action: validate before the host is asked anything, the version
from the host, the intent and the rendered unit for THAT version, the drift check with them, and
the host's own SGLang checking the arguments only when the host must change. Each failure stops
what follows it. The host's modules and the template rendering are scripted."""
import pytest
from ansible.template import trust_as_template

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
    "sglang_speculative_tree_budget": None,
}
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


def compare(host, settings=None, rendered=None, commands=None, **over):
    """The action with `host`'s modules; with `commands` (a Commands), through a pipelining connection whose
    commands it answers, else the module path (a connection without pipelining)."""
    args = dict(settings=dict(settings or SETTINGS), version="", address="10.0.0.7", worker_url="",
                templates={"unit": "sglang.service.j2", "journald": "journald-ratelimit.conf.j2"},
                paths={"unit": UNIT, "journald": JOURNALD}, secret_files=[], receipt_dir="/var/lib/r",
                last_good_dir="/var/lib/l", prompt="The capital of France is", max_new_tokens=16)
    args.update(over)
    action = fakes.make_action(action_mod, args, action="gpufleet.inference.sglang_compare")
    action._execute_module = host
    action._is_pipelining_enabled = lambda *a, **k: commands is not None
    if commands is not None:
        action._low_level_execute_command = commands
    renders = rendered if rendered is not None else []
    action._render = lambda template, task_vars, values: renders.append(
        (template, values["__sglang_version"])) or "%s for %s" % (template, values["__sglang_version"])
    return action.run(task_vars={"inventory_hostname": "gpu-1"})


def test_a_host_that_must_change_is_compared_with_its_versions_intent_then_its_sglang_checks_the_arguments():
    host = Host(sglang_preflight=[{"changed": False, "version": "0.5.23", "version_source": "metadata"},
                                  {"changed": False, "version": "0.5.23", "checked": ["parse"], "unchecked": []}],
                sglang_drift=[DRIFTED])
    rendered = []
    out = compare(host, rendered=rendered)
    assert not out.get("failed"), out
    assert host.names() == ["sglang_preflight", "sglang_drift", "sglang_preflight"]
    intent = _args.build_intent(SETTINGS, "0.5.23")
    assert host.calls[0][1] == {"python": "/opt/sglang/venv/bin/python",
                                "environment": {"SGLANG_SIM_LOAD_SECONDS": "4"}}  # version only: no args
    drift_args = host.calls[1][1]
    assert (drift_args["expect"], drift_args["command"], drift_args["config_line"]) == (
        intent["expect"], intent["command"], intent["config_line"])
    assert drift_args["server_info"] == _args.intended_server_info(SETTINGS, "0.5.23")
    # The files compared are the role's templates rendered for the DETECTED version.
    assert rendered == [("sglang.service.j2", "0.5.23"), ("journald-ratelimit.conf.j2", "0.5.23")]
    assert [(f["path"], f["content"]) for f in drift_args["files"]] == [
        (UNIT, "sglang.service.j2 for 0.5.23"), (JOURNALD, "journald-ratelimit.conf.j2 for 0.5.23")]
    assert drift_args["files"][1]["restart_on_change"] is False
    assert drift_args["url"] == "http://127.0.0.1:30000" and "api_key" not in drift_args
    assert drift_args["accounts"] == {"user": "sglang", "group": "sglang"}
    assert host.calls[2][1]["args"] == intent["command"][3:]
    # The drift result is the task's result (register: sglang_drift), plus what later steps use.
    assert out["verdict"] == "drifted" and out["changed_files"] == [UNIT] and out["changed"] is False
    assert out["prepared"]["version"] == "0.5.23" and out["prepared"]["intent"] == intent
    assert out["prepared"]["endpoint"] == {"url": "http://127.0.0.1:30000", "worker_url": "http://10.0.0.7:30000"}
    assert out["prepared"]["unit_text"] == "sglang.service.j2 for 0.5.23"
    assert out["preflight"] == {"checked": ["parse"], "unchecked": []}


def test_a_host_in_sync_is_not_checked_again_and_a_given_version_is_not_detected():
    host = Host(sglang_drift=[IN_SYNC])
    rendered = []
    out = compare(host, rendered=rendered, version="0.5.11", worker_url="http://gpu-1.lb:30000")
    assert not out.get("failed"), out
    assert host.names() == ["sglang_drift"]
    assert rendered[0] == ("sglang.service.j2", "0.5.11")
    assert host.calls[0][1]["command"] == _args.build_intent(SETTINGS, "0.5.11")["command"]
    assert out["prepared"]["endpoint"]["worker_url"] == "http://gpu-1.lb:30000"
    assert out["prepared"]["version_source"] == "sglang_version" and "preflight" not in out


def test_preflight_false_never_checks_the_arguments():
    host = Host(sglang_drift=[DRIFTED])
    assert not compare(host, version="0.5.23", preflight=False).get("failed")
    assert host.names() == ["sglang_drift"]


@pytest.mark.parametrize("over,message", [
    ({"sglang_speculative_draft_window_size": 8}, "sglang_speculative_draft_window_size (8) must be >="),
    ({"sglang_tp_size": -2}, "sglang_tp_size must be a positive integer"),
    ({"sglang_extra_args": {"mem-fraction-static": 0.8}}, "is not a --flag"),
])
def test_invalid_settings_fail_before_the_host_is_asked_anything(over, message):
    host = Host()
    rendered = []
    out = compare(host, settings=dict(SETTINGS, **over), rendered=rendered)
    assert out["failed"] and message in out["msg"] and out["step"] == "validate", out
    assert host.calls == [] and rendered == []


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
    out = compare(host, version="0.5.23")
    assert out["unreachable"] and out["failed"] and out["step"] == "drift", out
    assert host.names() == ["sglang_drift"]


def test_the_api_key_goes_to_the_drift_check_and_nowhere_in_the_result():
    host = Host(sglang_drift=[IN_SYNC])
    secret = [{"path": "/etc/sglang/sglang.yaml", "content": "api-key: k3y-s3cret\n", "mode": "0640"}]
    out = compare(host, settings=dict(SETTINGS, sglang_api_key="k3y-s3cret"), version="0.5.23",
                  secret_files=secret)
    drift_args = host.calls[0][1]
    assert drift_args["api_key"] == "k3y-s3cret" and drift_args["secret_files"] == secret
    assert "k3y-s3cret" not in repr(out)
    assert "--api-key" not in drift_args["command"]


def test_without_secret_files_the_config_file_comes_from_the_settings_and_only_its_path_is_prepared():
    host = Host(sglang_drift=[IN_SYNC])
    args = dict(settings=dict(SETTINGS, sglang_api_key="k3y-s3cret"), version="0.5.23")
    out = compare(host, **args)
    # compare() passes secret_files=[]: given, they are used as given (none here)
    assert host.calls[0][1]["secret_files"] == []
    host = Host(sglang_drift=[IN_SYNC])
    out = compare(host, secret_files=None, **args)
    config = {"path": "/etc/sglang/sglang.yaml", "mode": "0640", "owner": "root", "group": "sglang"}
    assert host.calls[0][1]["secret_files"] == [dict(config, content='api-key: "k3y-s3cret"\n')]
    assert out["prepared"]["config_file"] == config
    assert out["prepared"]["unit_files"] == [UNIT, "/etc/sglang/sglang.yaml"]
    assert out["prepared"]["paths"] == {"unit": UNIT, "journald": JOURNALD}
    assert "k3y-s3cret" not in repr(out)
    # no API key: no config file, and only the unit is kept as last-known-good
    host = Host(sglang_drift=[IN_SYNC])
    out = compare(host, secret_files=None, settings=dict(SETTINGS), version="0.5.23")
    assert host.calls[0][1]["secret_files"] == []
    assert out["prepared"]["config_file"] is None and out["prepared"]["unit_files"] == [UNIT]


def test_the_derived_secret_files_are_the_roles_own_secret_files():
    # One shape for the config file: the role's __sglang_secret_files (apply, revert) and the actions' derivation.
    from pathlib import Path

    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    role = yaml.safe_load((Path(__file__).resolve().parents[4] / "roles" / "sglang" / "vars" / "main.yml").read_text())
    for key in ("", 'k"3y\U0001F600', "plain"):
        settings = dict(SETTINGS, sglang_api_key=key, sglang_group="inference")
        variables = dict(settings, **dict((name, trust_as_template(value) if isinstance(value, str) else value)
                                          for name, value in role.items()))
        templar = Templar(loader=DataLoader(), variables=variables)
        assert templar.template(trust_as_template("{{ __sglang_secret_files }}")) == _args.secret_files(settings)
        assert templar.template(trust_as_template("{{ __sglang_unit_files }}")) == (
            ["/etc/systemd/system/sglang.service"] + (["/etc/sglang/sglang.yaml"] if key else []))


def test_settings_without_the_roles_keys_are_refused():
    settings = dict(SETTINGS)
    del settings["sglang_python"]
    with pytest.raises(Exception, match="settings lack sglang_python"):
        compare(Host(), settings=settings)


def test_a_host_lost_during_the_argument_check_is_unreachable():
    host = Host(sglang_preflight=[{"unreachable": True, "msg": "ssh: connection reset"}], sglang_drift=[DRIFTED])
    out = compare(host, version="0.5.23")
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
    args = dict(settings=dict(SETTINGS), version="", address="10.0.0.7", worker_url="",
                templates={"unit": "u", "journald": "j"}, paths={"unit": UNIT, "journald": JOURNALD},
                secret_files=[], receipt_dir="/r", last_good_dir="/l", prompt="p", max_new_tokens=1)
    action = fakes.make_action(action_mod, args, action="gpufleet.inference.sglang_compare")
    action._execute_module = host
    action._connection.is_pipelining_enabled = lambda *a, **k: False  # what _is_pipelining_enabled asks
    action._low_level_execute_command = commands
    action._render = lambda template, task_vars, values: "rendered"
    out = action.run(task_vars={"inventory_hostname": "gpu-1"})
    assert not out.get("failed") and host.names() == ["sglang_preflight", "sglang_drift"] and commands.inputs == []


# ------------------------------------------------------------------ the role's variables (tasks/compare.yml)

def compare_in_role(host, variables, over_settings=None):
    """The action as the role's tasks/compare.yml runs it: a real loader and templar, the role's own
    argument spec and defaults, `variables` over them (inventory values, possibly templated)."""
    from pathlib import Path
    from unittest.mock import MagicMock

    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    role_path = Path(__file__).resolve().parents[4] / "roles" / "sglang"
    # The role's files are trusted templates (as Ansible loads them); inventory values below as given.
    task_vars = dict((key, trust_as_template(value) if isinstance(value, str) else value)
                     for key, value in yaml.safe_load((role_path / "defaults" / "main.yml").read_text()).items())
    task_vars.update(dict(inventory_hostname="gpu-1", sglang_model_path="/models/Kimi-K2.6"), **variables)
    loader = DataLoader()
    templar = Templar(loader=loader, variables=task_vars)
    # The task's `settings: "{{ __sglang_settings }}"`, templated as Ansible templates the task's arguments.
    raw = yaml.safe_load((role_path / "vars" / "main.yml").read_text())["__sglang_settings"]
    settings = templar.template(dict((key, trust_as_template(value)) for key, value in raw.items()))
    settings.update(over_settings or {})
    args = dict(settings=settings, version="", address="10.0.0.7", worker_url="",
                templates={"unit": "sglang.service.j2", "journald": "journald-ratelimit.conf.j2"},
                paths={"unit": UNIT, "journald": JOURNALD}, secret_files=[], receipt_dir="/var/lib/r",
                last_good_dir="/var/lib/l", prompt="The capital of France is", max_new_tokens=16,
                role_argument_spec="drift")
    action = fakes.make_action(action_mod, args, action="gpufleet.inference.sglang_compare")
    action._task._role = MagicMock(_role_path=str(role_path))
    action._loader = loader
    action._templar = templar
    action._execute_module = host
    action._is_pipelining_enabled = lambda *a, **k: False
    action._render = lambda template, task_vars, values: "%s for %s" % (template, values["__sglang_version"])
    return action.run(task_vars=task_vars)


def test_valid_role_variables_pass_the_roles_own_argument_spec_and_the_comparison_goes_on():
    host = Host(sglang_preflight=[{"changed": False, "version": "0.5.23", "version_source": "metadata"}],
                sglang_drift=[IN_SYNC])
    out = compare_in_role(host, {"sglang_port": trust_as_template("{{ 30000 + 1 }}"), "sglang_ready_timeout": 900})
    assert not out.get("failed"), out
    assert host.names() == ["sglang_preflight", "sglang_drift"]


@pytest.mark.parametrize("variables, named", [
    ({"sglang_port": "thirty"}, "sglang_port"),  # a type the argument spec rejects
    ({"sglang_restart": "sometimes"}, "sglang_restart"),  # not one of its choices
    ({"sglang_ready_timeout": trust_as_template("{{ 'soon' }}")}, "sglang_ready_timeout"),  # rendered, then checked
    ({"sglang_timeout_start_sec": [600]}, "sglang_timeout_start_sec"),
])
def test_invalid_role_variables_fail_naming_them_before_the_host_is_asked_anything(variables, named):
    host = Host()
    out = compare_in_role(host, variables)
    assert out["failed"] and out["step"] == "validate", out
    assert named in out["msg"] and any(named in error for error in out["argument_errors"]), out
    assert out["msg"].startswith("gpu-1: the role's variables are not valid"), out["msg"]
    assert host.calls == []  # the host was asked nothing


def test_a_setting_is_checked_with_the_value_the_tasks_arguments_templated_not_templated_again():
    # settings (the task's arguments) hold the role's variables templated once; the check reads them
    # there. A value that only the arguments hold is the one checked (and named when it is wrong).
    host = Host()
    out = compare_in_role(host, {}, over_settings={"sglang_tp_size": "eight"})
    assert out["failed"] and out["step"] == "validate", out
    assert any("sglang_tp_size" in error for error in out["argument_errors"]), out
    assert host.calls == []
    # The variables that settings does not hold are still templated and checked.
    out = compare_in_role(Host(), {"sglang_ready_timeout": trust_as_template("{{ 'soon' }}")},
                          over_settings={"sglang_tp_size": 8})
    assert out["failed"] and any("sglang_ready_timeout" in error for error in out["argument_errors"]), out


def test_role_argument_spec_outside_a_role_or_of_an_unknown_entry_point_is_an_error():
    from ansible.errors import AnsibleActionFail
    action = fakes.make_action(action_mod, dict(settings=dict(SETTINGS), templates={"unit": "u", "journald": "j"},
                                                paths={"unit": UNIT, "journald": JOURNALD}, receipt_dir="/r",
                                                last_good_dir="/l", prompt="p", max_new_tokens=1,
                                                role_argument_spec="drift"))
    action._task._role = None
    with pytest.raises(AnsibleActionFail, match="needs the task to be in a role"):
        action.run(task_vars={})
    with pytest.raises(AnsibleActionFail, match="no entry point 'nowhere'"):
        unknown_entry_point(Host())


def unknown_entry_point(host):
    from pathlib import Path
    from unittest.mock import MagicMock

    from ansible.parsing.dataloader import DataLoader
    action = fakes.make_action(action_mod, dict(settings=dict(SETTINGS), templates={"unit": "u", "journald": "j"},
                                                paths={"unit": UNIT, "journald": JOURNALD}, receipt_dir="/r",
                                                last_good_dir="/l", prompt="p", max_new_tokens=1,
                                                role_argument_spec="nowhere"))
    action._task._role = MagicMock(_role_path=str(Path(__file__).resolve().parents[4] / "roles" / "sglang"))
    action._loader = DataLoader()
    action._execute_module = host
    return action.run(task_vars={})


# ------------------------------------------------------------------ rendering without the template lookup

@pytest.mark.parametrize("template", ["sglang.service.j2", "journald-ratelimit.conf.j2"])
@pytest.mark.parametrize("over", [
    {},
    {"ansible_managed": "managed by the fleet team", "sglang_api_key": "k-123",
     "sglang_environment": {"NCCL_DEBUG": "WARN", "PATH": "/opt/x:/usr/bin"},
     "sglang_extra_args": {"--mem-fraction-static": 0.8}, "sglang_served_model_name": "kimi 100%"},
])
def test_the_role_templates_render_byte_for_byte_as_the_template_lookup_renders_them(template, over):
    from pathlib import Path

    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import lookup_loader
    from ansible.template import Templar

    role = Path(__file__).resolve().parents[4] / "roles" / "sglang"
    loader = DataLoader()
    task_vars = {}
    for part in ("defaults", "vars"):
        task_vars.update(loader.load_from_file(str(role / part / "main.yml"), trusted_as_template=True))
    task_vars.update(dict(inventory_hostname="gpu-1", sglang_model_path="/models/Kimi-K2.6",
                          ansible_search_path=[str(role)]), **over)
    templar = Templar(loader=loader, variables=task_vars)
    settings = templar.template(task_vars["__sglang_settings"])
    lookup = lookup_loader.get("ansible.builtin.template", loader=loader, templar=templar)
    expected = lookup.run([template], task_vars, template_vars={"__sglang_version": "0.5.23"})[0]
    values = dict(settings, __sglang_settings=settings, __sglang_version="0.5.23")
    rendered = action_mod.render_template(templar, loader, str(role / "templates" / template), template, task_vars,
                                          values)
    assert rendered == expected
    assert ("ExecStart=" in rendered) is (template == "sglang.service.j2")
    assert ("[Journal]" if template.startswith("journald") else "[Unit]") in rendered
    assert ("managed by the fleet team" in rendered) is ("ansible_managed" in over)
