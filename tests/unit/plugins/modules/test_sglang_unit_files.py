# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_unit_files on real files under tmp_path: install, idempotence, verify-before-write, secrets."""
import os
import shutil
import stat

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.modules import sglang_unit_files

from fakes import ModuleExit, patch_module_exits

UID = os.getuid()
GID = os.getgid()
GOOD_UNIT = "[Unit]\nDescription=x\n\n[Service]\nExecStart=/bin/true\n"
BAD_UNIT = "[Service]\nExecStart=relative/path --x\n"
SECRET = 'api_key: "uf-s3cret"\n'
needs_systemd = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")


def spec(path, content, mode="0644", verify=False):
    return {"path": str(path), "content": content, "mode": mode, "owner": str(UID), "group": str(GID),
            "verify_unit": verify}


def run(monkeypatch, files=(), secret_files=(), check_mode=False, diff=False):
    patch_module_exits(monkeypatch)
    with patch_module_args({"files": list(files), "secret_files": list(secret_files),
                            "_ansible_check_mode": check_mode, "_ansible_diff": diff}):
        with pytest.raises(ModuleExit) as caught:
            sglang_unit_files.main()
    return caught.value.result, caught.value.failed


def mode_of(path):
    return stat.S_IMODE(os.stat(str(path)).st_mode)


@needs_systemd
def test_installs_missing_files_and_their_directories_then_is_idempotent(monkeypatch, tmp_path):
    unit = tmp_path / "system" / "demo.service"
    config = tmp_path / "etc" / "sglang" / "sglang.yaml"
    files, secrets = [spec(unit, GOOD_UNIT, verify=True)], [spec(config, SECRET, mode="0640")]
    result, failed = run(monkeypatch, files, secrets)
    assert not failed and result["changed"] is True
    assert result["changed_files"] == [str(unit), str(config)]
    assert sorted(result["created_dirs"]) == sorted([str(unit.parent), str(config.parent)])
    assert unit.read_text() == GOOD_UNIT and config.read_text() == SECRET
    assert mode_of(unit) == 0o644 and mode_of(config) == 0o640
    again, failed = run(monkeypatch, files, secrets)
    assert not failed and again["changed"] is False and again["changed_files"] == []


def test_a_mode_change_alone_is_a_change(monkeypatch, tmp_path):
    path = tmp_path / "sglang.yaml"
    path.write_text(SECRET)
    os.chmod(str(path), 0o644)
    result, failed = run(monkeypatch, secret_files=[spec(path, SECRET, mode="0640")])
    assert not failed and result["changed_files"] == [str(path)]
    assert mode_of(path) == 0o640


@needs_systemd
def test_a_unit_systemd_rejects_never_lands_and_nothing_else_is_written(monkeypatch, tmp_path):
    unit = tmp_path / "demo.service"
    unit.write_text(GOOD_UNIT)
    other = tmp_path / "other.conf"
    result, failed = run(monkeypatch, [spec(unit, BAD_UNIT, verify=True), spec(other, "x\n")])
    assert failed
    assert "systemd-analyze verify rejected %s" % unit in result["msg"]
    assert "Nothing was written" in result["msg"]
    assert unit.read_text() == GOOD_UNIT  # the old unit stays
    assert not other.exists()  # and no other file of the call was written
    assert [p.name for p in tmp_path.iterdir()] == ["demo.service"]  # no temporary file left


def test_check_mode_reports_and_writes_nothing(monkeypatch, tmp_path):
    unit = tmp_path / "demo.service"
    unit.write_text("old\n")
    result, failed = run(monkeypatch, [spec(unit, BAD_UNIT, verify=True)], check_mode=True)
    assert not failed and result["changed"] is True and result["changed_files"] == [str(unit)]
    assert unit.read_text() == "old\n"


def test_diff_shows_a_unit_but_never_a_secret(monkeypatch, tmp_path):
    unit, config = tmp_path / "a.conf", tmp_path / "sglang.yaml"
    unit.write_text("old\n")
    config.write_text('api_key: "old-s3cret"\n')
    result, failed = run(monkeypatch, [spec(unit, "new\n")], [spec(config, SECRET, mode="0640")], diff=True)
    assert not failed
    text = repr(result)
    assert "old\\n" in text and "new\\n" in text
    assert "s3cret" not in text
    assert result["diff"][1]["after"] == "(secret file changed: content, mode)\n"


@pytest.mark.parametrize("field,value,message", [
    ("owner", "no-such-user-gpf", "user no-such-user-gpf does not exist"),
    ("group", "no-such-group-gpf", "group no-such-group-gpf does not exist"),
    ("mode", "rw-r--r--", "is not an octal mode"),
    ("path", "relative/unit.service", "is not an absolute path"),
])
def test_bad_input_fails_before_anything_is_written(monkeypatch, tmp_path, field, value, message):
    good = tmp_path / "first.conf"
    bad = spec(tmp_path / "second.conf", "x\n")
    bad[field] = value
    result, failed = run(monkeypatch, [spec(good, "x\n"), bad])
    assert failed and message in result["msg"]
    assert not good.exists()


class Systemctl(object):
    """AnsibleModule.run_command for systemctl: records each argv; `show` answers the unit's state,
    `fail` names the verb that fails."""

    def __init__(self, unit_file_state="enabled", fail=None):
        self.calls = []
        self.unit_file_state = unit_file_state
        self.fail = fail

    def __call__(self, module, argv, **kwargs):
        argv = list(argv)
        self.calls.append(argv[1:])
        if argv[1] == self.fail:
            return 1, "", "Job for demo.service failed because the control process exited with error code."
        if argv[1] == "show":
            return 0, "Id=demo.service\nInvocationID=aaaa\nActiveState=active\nSubState=running\nMainPID=42\n" \
                      "UnitFileState=%s\n" % self.unit_file_state, ""
        return 0, "", ""

    def verbs(self):
        return [call[0] for call in self.calls]


def run_with_restart(monkeypatch, systemctl, files=(), restart=None, check_mode=False):
    def run_command(module, argv, **kwargs):
        return systemctl(module, argv, **kwargs)

    monkeypatch.setattr(sglang_unit_files.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(sglang_unit_files.AnsibleModule, "get_bin_path",
                        lambda module, name, required=False, opt_dirs=None: "/usr/bin/" + name)
    patch_module_exits(monkeypatch)
    with patch_module_args({"files": list(files), "secret_files": [], "restart": restart,
                            "_ansible_check_mode": check_mode}):
        with pytest.raises(ModuleExit) as caught:
            sglang_unit_files.main()
    return caught.value.result, caught.value.failed


def test_restart_after_a_written_file_reloads_enables_and_restarts_in_that_order(monkeypatch, tmp_path):
    path = tmp_path / "demo.conf"
    systemctl = Systemctl(unit_file_state="disabled")
    result, failed = run_with_restart(monkeypatch, systemctl, [spec(path, "x=1\n")], {"unit": "demo.service"})
    assert not failed and result["changed"] is True and result["restarted"] is True
    assert path.read_text() == "x=1\n"
    assert systemctl.verbs() == ["daemon-reload", "show", "enable", "restart"]
    assert systemctl.calls[2] == ["enable", "demo.service"] and systemctl.calls[3] == ["restart", "demo.service"]
    assert result["status"]["InvocationID"] == "aaaa"  # read before the restart: the process it replaced


def test_restart_only_when_a_file_was_written_unless_forced(monkeypatch, tmp_path):
    path = tmp_path / "demo.conf"
    path.write_text("x=1\n")
    os.chmod(str(path), 0o644)
    systemctl = Systemctl()
    result, failed = run_with_restart(monkeypatch, systemctl, [spec(path, "x=1\n")], {"unit": "demo.service"})
    assert not failed and result["changed"] is False and result["restarted"] is False and systemctl.calls == []
    forced, failed = run_with_restart(monkeypatch, systemctl, [spec(path, "x=1\n")],
                                      {"unit": "demo.service", "force": True})
    assert not failed and forced["changed"] is True and forced["restarted"] is True
    assert systemctl.verbs() == ["daemon-reload", "show", "restart"]  # already enabled: not enabled again


def test_a_failed_restart_after_the_write_says_both_and_is_a_change(monkeypatch, tmp_path):
    path = tmp_path / "demo.conf"
    systemctl = Systemctl(fail="restart")
    result, failed = run_with_restart(monkeypatch, systemctl, [spec(path, "x=1\n")], {"unit": "demo.service"})
    assert failed and result["failed_at"] == "restart" and result["changed"] is True
    assert result["changed_files"] == [str(path)] and path.read_text() == "x=1\n"
    assert "%s written, but restart demo.service failed (exit 1): Job for demo.service failed" % path in result["msg"]


def test_check_mode_restarts_nothing_and_writes_nothing(monkeypatch, tmp_path):
    path = tmp_path / "demo.conf"
    systemctl = Systemctl()
    result, failed = run_with_restart(monkeypatch, systemctl, [spec(path, "x=1\n")], {"unit": "demo.service"},
                                      check_mode=True)
    assert not failed and result["restarted"] is True and result["changed"] is True
    assert systemctl.calls == [] and not path.exists()


# ------------------------------------------------------------------ the lease option (a writer's step)

HOLDER = {"kind": "rollout", "run_id": "r1", "session": "s1", "generation": 1}


def run_leased(monkeypatch, tmp_path, files, check_mode=False, holder=None):
    patch_module_exits(monkeypatch)
    lease = {"unit": "sglang.service", "directory": str(tmp_path / "fleet"), "holder": holder or HOLDER,
             "seconds": 300, "record": {"run_id": "r1", "step": "applying", "status": "updating"}}
    with patch_module_args({"files": list(files), "lease": lease, "_ansible_check_mode": check_mode}):
        with pytest.raises(ModuleExit) as caught:
            sglang_unit_files.main()
    return caught.value.result, caught.value.failed


def test_the_lease_option_renews_the_writers_lease_and_records_its_step_before_it_writes(monkeypatch, tmp_path):
    from ansible_collections.gpufleet.inference.plugins.module_utils import _lease
    directory = str(tmp_path / "fleet")
    taken = _lease.hold(directory, "sglang.service", dict(HOLDER, generation=None), 300, 1000.0)
    holder = dict(HOLDER, generation=taken["lease"]["generation"])
    path = tmp_path / "sglang.yaml"
    result, failed = run_leased(monkeypatch, tmp_path, [spec(path, "a: 1\n")], holder=holder)
    assert not failed and result["changed_files"] == [str(path)] and path.read_text() == "a: 1\n"
    assert result["lease"]["generation"] == holder["generation"] and result["lease"]["live"] is True
    files = _lease.paths(directory, "sglang.service")
    record = _lease.read(files["record"])
    assert record["step"] == "applying" and [item["step"] for item in record["steps"]] == ["applying"]
    assert _lease.read(files["lease"])["renewed"] > 1000.0


def test_the_lease_option_refuses_a_lease_taken_over_and_writes_no_file(monkeypatch, tmp_path):
    from ansible_collections.gpufleet.inference.plugins.module_utils import _lease
    directory = str(tmp_path / "fleet")
    ours = _lease.hold(directory, "sglang.service", dict(HOLDER, generation=None), 1, 1000.0)
    # another writer takes the expired lease over
    _lease.hold(directory, "sglang.service", {"kind": "sweep", "run_id": "sw-2", "session": "s9", "controller": "b3"},
                300, 2000.0)
    path = tmp_path / "sglang.yaml"
    result, failed = run_leased(monkeypatch, tmp_path, [spec(path, "a: 1\n")],
                                holder=dict(HOLDER, generation=ours["lease"]["generation"]))
    assert failed and result["action"] == "refused" and result["changed"] is False
    assert "taken over" in result["msg"] and "sweep sw-2" in result["msg"] and "Nothing was changed" in result["msg"]
    assert not path.exists()
    assert _lease.read(_lease.paths(directory, "sglang.service")["record"]) is None  # the step was not recorded


def test_the_lease_option_in_check_mode_judges_the_lease_and_writes_nothing(monkeypatch, tmp_path):
    from ansible_collections.gpufleet.inference.plugins.module_utils import _lease
    directory = str(tmp_path / "fleet")
    taken = _lease.hold(directory, "sglang.service", dict(HOLDER, generation=None), 300, 1000.0)
    files = _lease.paths(directory, "sglang.service")
    before = open(files["lease"]).read()
    path = tmp_path / "sglang.yaml"
    result, failed = run_leased(monkeypatch, tmp_path, [spec(path, "a: 1\n")], check_mode=True,
                                holder=dict(HOLDER, generation=taken["lease"]["generation"]))
    assert not failed and result["changed_files"] == [str(path)] and not path.exists()
    assert open(files["lease"]).read() == before and _lease.read(files["record"]) is None


def test_the_lease_option_only_renews_a_lease_its_holder_took(monkeypatch, tmp_path):
    path = tmp_path / "sglang.yaml"
    result, failed = run_leased(monkeypatch, tmp_path, [spec(path, "a: 1\n")], holder=dict(HOLDER, generation=None))
    assert failed and "lease.holder.generation is needed" in result["msg"] and result["changed"] is False
    assert not path.exists() and not (tmp_path / "fleet").exists()
