# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sglang_last_good module on real files under tmp_path: save, restore, query, check mode."""
import json
import os
import stat

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.modules import sglang_last_good

from fakes import NEW, ModuleExit, patch_module_exits

UNIT_TEXT = "[Service]\nExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server --port 30000\n"
SECRET = 'api_key: "lg-s3cret"\n'


@pytest.fixture
def tree(tmp_path):
    """A unit file and a config file as the role installs them, and an empty last-good directory."""
    etc = tmp_path / "etc"
    etc.mkdir()
    unit = etc / "sglang.service"
    unit.write_text(UNIT_TEXT)
    os.chmod(str(unit), 0o644)
    config = etc / "sglang.yaml"
    config.write_text(SECRET)
    os.chmod(str(config), 0o640)
    return {"unit": str(unit), "config": str(config), "directory": str(tmp_path / "last-good"), "tmp": tmp_path}


def last_good(monkeypatch, tree, check_mode=False, **args):
    args.setdefault("directory", tree["directory"])
    patch_module_exits(monkeypatch)
    with patch_module_args(dict(args, _ansible_check_mode=check_mode)):
        with pytest.raises(ModuleExit) as caught:
            sglang_last_good.main()
    return caught.value.result, caught.value.failed


def save(monkeypatch, tree, check_mode=False, record=None, files=None):
    return last_good(monkeypatch, tree, check_mode, state="saved", files=files or [tree["unit"], tree["config"]],
                     record=record if record is not None else {"invocation_id": NEW, "expect": {"block_size": 16}})


def unit_dir(tree):
    return os.path.join(tree["directory"], "sglang.service")


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


# --------------------------------------------------------------------------- saved

def test_save_copies_the_files_with_their_modes_and_writes_the_record(monkeypatch, tree):
    result, failed = save(monkeypatch, tree)
    assert not failed and result["changed"] is True and result["exists"] is True
    assert sorted(result["changed_files"]) == sorted([tree["unit"], tree["config"]])
    assert result["files"] == sorted([tree["unit"], tree["config"]], key=sglang_last_good._copy_name)
    record = result["record"]
    assert record["invocation_id"] == NEW and record["expect"] == {"block_size": 16}
    assert isinstance(record["saved_at"], float)
    assert mode_of(unit_dir(tree)) == 0o700
    on_disk = json.loads(open(os.path.join(unit_dir(tree), "record.json")).read())
    assert on_disk == record and mode_of(os.path.join(unit_dir(tree), "record.json")) == 0o600
    copies = dict((item["path"], item) for item in record["files"])
    assert copies[tree["unit"]]["mode"] == "0644" and copies[tree["config"]]["mode"] == "0640"
    copy = os.path.join(unit_dir(tree), copies[tree["config"]]["copy"])
    assert open(copy).read() == SECRET and mode_of(copy) == 0o640
    # the secret's content is not part of the result
    assert "lg-s3cret" not in json.dumps(result)
    assert not [name for name in os.listdir(unit_dir(tree)) if name.startswith(".gpufleet-")]  # no temp files


def test_saving_the_same_again_changes_nothing(monkeypatch, tree):
    first, failed = save(monkeypatch, tree)
    again, failed = save(monkeypatch, tree)
    assert again["changed"] is False and again["changed_files"] == []
    assert again["record"]["saved_at"] == first["record"]["saved_at"]  # the record was not rewritten


def test_a_new_record_alone_is_a_change(monkeypatch, tree):
    save(monkeypatch, tree)
    result, failed = save(monkeypatch, tree, record={"invocation_id": "another"})
    assert result["changed"] is True and result["changed_files"] == [os.path.join(unit_dir(tree), "record.json")]
    assert result["record"]["invocation_id"] == "another"


def test_a_changed_file_is_saved_again(monkeypatch, tree):
    save(monkeypatch, tree)
    with open(tree["unit"], "a") as handle:
        handle.write("Environment=A=1\n")
    result, failed = save(monkeypatch, tree)
    assert result["changed_files"] == [tree["unit"]]
    copy = [item["copy"] for item in result["record"]["files"] if item["path"] == tree["unit"]][0]
    assert open(os.path.join(unit_dir(tree), copy)).read().endswith("Environment=A=1\n")


def test_a_file_that_no_longer_exists_is_dropped_from_the_copy(monkeypatch, tree):
    first, failed = save(monkeypatch, tree)
    old_copy = [item["copy"] for item in first["record"]["files"] if item["path"] == tree["config"]][0]
    os.unlink(tree["config"])
    result, failed = save(monkeypatch, tree)
    assert result["changed"] is True and tree["config"] in result["changed_files"]
    assert result["files"] == [tree["unit"]]
    assert not os.path.exists(os.path.join(unit_dir(tree), old_copy))


def test_check_mode_save_writes_nothing_and_predicts_the_change(monkeypatch, tree):
    result, failed = save(monkeypatch, tree, check_mode=True)
    assert not failed and result["changed"] is True
    assert sorted(result["changed_files"]) == sorted([tree["unit"], tree["config"]])
    assert result["record"]["saved_at"] is None
    assert not os.path.exists(tree["directory"])


def test_check_mode_predicts_a_record_only_change(monkeypatch, tree):
    save(monkeypatch, tree)
    result, failed = save(monkeypatch, tree, check_mode=True, record={"invocation_id": "another"})
    assert result["changed"] is True


def test_save_without_files_fails(monkeypatch, tree):
    result, failed = last_good(monkeypatch, tree, state="saved", record={"invocation_id": NEW})
    assert failed


# --------------------------------------------------------------------------- restored

def test_restore_puts_changed_files_back_with_their_modes(monkeypatch, tree):
    save(monkeypatch, tree)
    with open(tree["unit"], "w") as handle:
        handle.write("broken\n")
    os.chmod(tree["unit"], 0o600)
    result, failed = last_good(monkeypatch, tree, state="restored")
    assert not failed and result["changed"] is True and result["changed_files"] == [tree["unit"]]
    assert open(tree["unit"]).read() == UNIT_TEXT and mode_of(tree["unit"]) == 0o644
    assert open(tree["config"]).read() == SECRET  # unchanged: not rewritten
    assert result["record"]["invocation_id"] == NEW
    assert not [name for name in os.listdir(os.path.dirname(tree["unit"])) if name.startswith(".gpufleet-")]


def test_restore_of_a_deleted_file(monkeypatch, tree):
    save(monkeypatch, tree)
    os.unlink(tree["config"])
    result, failed = last_good(monkeypatch, tree, state="restored")
    assert result["changed_files"] == [tree["config"]]
    assert open(tree["config"]).read() == SECRET and mode_of(tree["config"]) == 0o640


def test_restore_when_nothing_differs_is_not_a_change(monkeypatch, tree):
    save(monkeypatch, tree)
    result, failed = last_good(monkeypatch, tree, state="restored")
    assert not failed and result["changed"] is False and result["changed_files"] == []


def test_check_mode_restore_changes_nothing(monkeypatch, tree):
    save(monkeypatch, tree)
    with open(tree["unit"], "w") as handle:
        handle.write("broken\n")
    result, failed = last_good(monkeypatch, tree, check_mode=True, state="restored")
    assert result["changed"] is True and result["changed_files"] == [tree["unit"]]
    assert open(tree["unit"]).read() == "broken\n"


def test_restore_without_a_copy_fails(monkeypatch, tree):
    result, failed = last_good(monkeypatch, tree, state="restored")
    assert failed and result["exists"] is False and result["changed_files"] == []
    assert result["msg"] == "no last-known-good copy of sglang.service in %s to restore" % unit_dir(tree)


def test_restore_of_an_incomplete_copy_fails_naming_the_file(monkeypatch, tree):
    first, failed = save(monkeypatch, tree)
    copy = [item["copy"] for item in first["record"]["files"] if item["path"] == tree["config"]][0]
    os.unlink(os.path.join(unit_dir(tree), copy))
    with open(tree["unit"], "w") as handle:
        handle.write("broken\n")
    result, failed = last_good(monkeypatch, tree, state="restored")
    assert failed and result["msg"] == "the last-known-good copy of sglang.service lacks %s (%s)" % (
        tree["config"], copy)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files another owner")
def test_restore_keeps_the_owner_and_group(monkeypatch, tree):
    os.chown(tree["config"], 0, 4321)
    save(monkeypatch, tree)
    with open(tree["config"], "w") as handle:  # the rollout wrote another key into it (owner unchanged)
        handle.write('api_key: "new"\n')
    assert os.stat(tree["config"]).st_gid == 4321
    result, failed = last_good(monkeypatch, tree, state="restored")
    assert result["changed_files"] == [tree["config"]] and open(tree["config"]).read() == SECRET
    assert os.stat(tree["config"]).st_gid == 4321


# --------------------------------------------------------------------------- query

def test_query(monkeypatch, tree):
    result, failed = last_good(monkeypatch, tree)
    assert not failed and result == {"changed": False, "exists": False, "record": None, "files": [],
                                     "changed_files": []}
    save(monkeypatch, tree)
    result, failed = last_good(monkeypatch, tree, state="query")
    assert result["exists"] is True and result["changed"] is False and len(result["files"]) == 2


def test_query_of_a_broken_record_is_none(monkeypatch, tree):
    os.makedirs(unit_dir(tree))
    with open(os.path.join(unit_dir(tree), "record.json"), "w") as handle:
        handle.write("{broken")
    result, failed = last_good(monkeypatch, tree)
    assert result["exists"] is False and result["record"] is None


def test_copy_names_are_flat():
    assert sglang_last_good._copy_name("/etc/systemd/system/sglang.service") == \
        "file__etc__systemd__system__sglang.service"


# --------------------------------------------------------------------------- saved from the running process

@pytest.fixture
def running(monkeypatch):
    """A real process standing in for the unit's main process; systemctl show answers its PID."""
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--window", "1024"],
                             env={"SGLANG_SIM_LOAD_SECONDS": "2", "OLD_ONLY": "x", "INVOCATION_ID": "abc", "HOME": "/root"})
    import time
    deadline = time.monotonic() + 10  # until the child has exec'd (before, /proc shows the forked parent)
    while b"--window" not in open("/proc/%d/cmdline" % child.pid, "rb").read() and time.monotonic() < deadline:
        time.sleep(0.01)
    calls = []

    def run_command(self, argv, **kwargs):
        calls.append(argv)
        return 0, "%d\n" % child.pid, ""
    from ansible.module_utils import basic
    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    yield child, calls
    child.kill()
    child.wait()


def test_from_process_keeps_what_runs_not_the_installed_unit(monkeypatch, tree, running):
    import sys
    child, calls = running
    record = {"invocation_id": NEW, "intent": {"environment": {"SGLANG_SIM_LOAD_SECONDS": "2",
                                                               "SGLANG_SIM_FAULT": "ignore_window"}}}
    result, failed = last_good(monkeypatch, tree, state="saved", files=[tree["unit"], tree["config"]],
                               record=record, from_process=True)
    assert not failed, result
    assert calls == [["systemctl", "show", "-p", "MainPID", "--value", "sglang.service"]]
    copy = os.path.join(unit_dir(tree), sglang_last_good._copy_name(tree["unit"]))
    saved = open(copy).read()
    assert 'ExecStart="%s" \\\n    "-c" \\\n    "import time; time.sleep(60)" \\\n    "--window" \\\n    "1024"\n' % (
        sys.executable) in saved
    assert 'Environment="OLD_ONLY=x"' in saved and 'Environment="SGLANG_SIM_LOAD_SECONDS=2"' in saved
    assert "INVOCATION_ID" not in saved and "HOME" not in saved and "--port 30000" not in saved
    assert open(tree["unit"]).read() == UNIT_TEXT  # the installed file is left alone
    config_copy = os.path.join(unit_dir(tree), sglang_last_good._copy_name(tree["config"]))
    assert open(config_copy).read() == SECRET  # other files as on disk
    kept = result["record"]
    # the revert verifies against the process's environment: the fault the new unit adds is not there
    assert kept["intent"]["environment"] == {"SGLANG_SIM_LOAD_SECONDS": "2"}
    assert kept["rebuilt_from_process"] == {"path": tree["unit"], "main_pid": child.pid}


def test_from_process_without_a_main_process_fails_and_saves_nothing(monkeypatch, tree):
    from ansible.module_utils import basic
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: (0, "0\n", ""))
    result, failed = last_good(monkeypatch, tree, state="saved", files=[tree["unit"]], record={}, from_process=True)
    assert failed and "has no running main process" in result["msg"] and "nothing saved" in result["msg"]
    assert not os.path.exists(unit_dir(tree))


# ------------------------------------------------------------------ the lease option (a writer's step)

def test_the_lease_option_records_the_step_before_saving_and_a_lease_taken_over_saves_nothing(monkeypatch, tree):
    from ansible_collections.gpufleet.inference.plugins.module_utils import _lease
    fleet = str(tree["tmp"] / "fleet")
    holder = {"kind": "rollout", "run_id": "r1", "session": "s1", "generation": None}
    holder["generation"] = _lease.hold(fleet, "sglang.service", holder, 300, 1000.0)["lease"]["generation"]
    lease = {"unit": "sglang.service", "directory": fleet, "holder": holder, "seconds": 300,
             "record": {"run_id": "r1", "step": "rejoined", "status": "updated"}}
    result, failed = last_good(monkeypatch, tree, state="saved", files=[tree["unit"]], record={"invocation_id": NEW},
                               lease=lease)
    assert not failed and result["exists"] and result["lease"]["generation"] == holder["generation"]
    assert _lease.read(_lease.paths(fleet, "sglang.service")["record"])["step"] == "rejoined"
    # another writer broke the lease: the next save (or restore) is refused and the copy stays as it was
    _lease.hold(fleet, "sglang.service", {"kind": "sweep", "run_id": "sw-2", "session": "s9"}, 300, 2000.0, force=True)
    kept = open(os.path.join(unit_dir(tree), "record.json")).read()
    result, failed = last_good(monkeypatch, tree, state="saved", files=[tree["unit"]], record={"invocation_id": "x"},
                               lease=lease)
    assert failed and result["action"] == "refused" and "sweep sw-2" in result["msg"]
    assert open(os.path.join(unit_dir(tree), "record.json")).read() == kept
    result, failed = last_good(monkeypatch, tree, state="restored", lease=lease)
    assert failed and result["action"] == "refused"
    # a query changes nothing and ignores the option
    result, failed = last_good(monkeypatch, tree, state="query", lease=lease)
    assert not failed and "lease" not in result and result["exists"]
