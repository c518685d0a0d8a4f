# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The records the role keeps: a verification from a drift check, an adopted last-known-good, a revert."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _records as rec

from fakes import CONFIG_2048, NEW

OBSERVED = {"attention_backend": "flashinfer", "model": "DFlashDraftModel", "block_size": 16,
            "draft_window_size": 2048, "compact_cache": True}


def drift(**overrides):
    data = {"host": "gpu-1", "invocation_id": NEW, "main_pid": 4242, "observed": OBSERVED,
            "config_line": CONFIG_2048, "config_lines": [CONFIG_2048], "source": "receipt", "version": "0.5.23",
            "command": ["/py", "-m", "sglang.launch_server"],
            "effective": {"environment": {"A": "1"}, "drop_in_paths": []}}
    data.update(overrides)
    return data


def test_verified_from_drift():
    record = rec.verified_from_drift(drift())
    assert record == {
        "verdict": "pass", "verified": True, "invocation_id": NEW, "main_pid": 4242, "observed": OBSERVED,
        "config_line": CONFIG_2048, "config_lines": [CONFIG_2048], "source": "receipt", "elapsed": 0.0,
        "phases": {},
        "msg": "gpu-1: invocation %s runs the intended settings (drift check; verified before, receipt kept)" % NEW}
    assert rec.verified_from_drift(drift(config_lines=None))["config_lines"] == []


def test_adopted_record_with_config_lines_requires_them_with_the_setting_keys_only():
    record = rec.adopted_record(drift())
    assert record["adopted"] is True and record["invocation_id"] == NEW and record["version"] == "0.5.23"
    assert record["intent"] == {"expect": {"block_size": 16, "draft_window_size": 2048, "compact_cache": True},
                                "config_line": "required", "command": ["/py", "-m", "sglang.launch_server"],
                                "environment": {"A": "1"}}
    # attention_backend and model describe the build, not the settings
    assert "model" not in record["intent"]["expect"] and record["observed"] == OBSERVED


@pytest.mark.parametrize("source", ["journal", "receipt"])
def test_adopted_record_without_lines_but_with_evidence_is_absent(source):
    record = rec.adopted_record(drift(config_lines=[], observed=None, source=source))
    assert record["intent"]["config_line"] == "absent" and record["intent"]["expect"] == {}
    assert record["observed"] is None


@pytest.mark.parametrize("source", [None, "server_info"])
def test_adopted_record_without_evidence_is_optional(source):
    record = rec.adopted_record(drift(config_lines=[], observed={}, source=source, effective=None))
    assert record["intent"]["config_line"] == "optional"
    assert record["intent"]["environment"] is None and record["observed"] is None


# --------------------------------------------------------------------------- revert_outcome

RESTORED = {"changed": True, "changed_files": ["/etc/systemd/system/sglang.service"], "record": {"invocation_id": "x"}}
RESTART = {"changed": True}
WAIT_PASS = {"verdict": "pass", "invocation_id": NEW, "observed": OBSERVED, "msg": "sglang.service: serving"}


def test_revert_that_passes():
    outcome = rec.revert_outcome([RESTORED, RESTART, WAIT_PASS])
    assert outcome == {"restored": True, "files": ["/etc/systemd/system/sglang.service"],
                       "record": {"invocation_id": "x"}, "invocation_id": NEW, "observed": OBSERVED,
                       "verdict": "pass", "msg": "sglang.service: serving", "healthy": True}


def test_revert_whose_files_could_not_be_restored():
    outcome = rec.revert_outcome([{"failed": True, "msg": "no last-known-good copy"}, {"skipped": True},
                                  {"skipped": True}])
    assert outcome["verdict"] == "not_restored" and not outcome["healthy"] and not outcome["restored"]
    assert outcome["msg"] == "the last-known-good files could not be put back: no last-known-good copy"


def test_revert_whose_restart_failed():
    outcome = rec.revert_outcome([RESTORED, {"failed": True, "msg": "Job failed"}, {"skipped": True}])
    assert outcome["verdict"] == "restart_failed" and outcome["restored"] and not outcome["healthy"]
    assert outcome["msg"] == "restarting with the last-known-good unit failed: Job failed"


@pytest.mark.parametrize("results", [[RESTORED, RESTART, {"skipped": True}], [RESTORED, RESTART], [RESTORED],
                                     [RESTORED, RESTART, None]])
def test_revert_not_verified(results):
    outcome = rec.revert_outcome(results)
    assert outcome["verdict"] == "not_verified" and not outcome["healthy"]
    assert outcome["msg"] == "the reverted process was not verified"


def test_revert_whose_wait_failed_keeps_the_waits_verdict():
    wait = {"verdict": "mismatch", "failed": True, "msg": "runs other settings", "invocation_id": NEW}
    outcome = rec.revert_outcome([RESTORED, RESTART, wait])
    assert (outcome["verdict"], outcome["msg"], outcome["healthy"]) == ("mismatch", "runs other settings", False)


def test_revert_with_nothing_to_restore_is_not_restored_nor_healthy():
    outcome = rec.revert_outcome([{"skipped": True}, {"skipped": True}, {"skipped": True}])
    assert outcome["restored"] is False and outcome["verdict"] == "not_verified" and not outcome["healthy"]
    assert rec.revert_outcome([])["verdict"] == "not_verified"


# --------------------------------------------------------------------------- verification

def test_verification_is_the_first_wait_that_ran():
    restart_wait = {"verdict": "pass", "invocation_id": NEW, "msg": "waited"}
    verify_only = {"verdict": "pass", "invocation_id": "other", "msg": "verified"}
    assert rec.verification([restart_wait, {"skipped": True}, drift()]) is restart_wait
    assert rec.verification([{"skipped": True, "changed": False}, verify_only, drift()]) is verify_only
    assert rec.verification([None, verify_only, drift()]) is verify_only


IN_SYNC = {"verdict": "in_sync", "in_sync": True, "receipt": True}


@pytest.mark.parametrize("waits", [[{"skipped": True}, {"skipped": True}], [{}, None], [None, {}], ["x", {}]])
def test_verification_falls_back_to_the_in_sync_drift_check(waits):
    result = rec.verification(waits + [drift(**IN_SYNC)])
    assert result == rec.verified_from_drift(drift(**IN_SYNC))
    assert result["verdict"] == "pass" and result["source"] == "receipt"


@pytest.mark.parametrize("result", [{"verdict": "drifted", "in_sync": False, "receipt": False},
                                    {"verdict": "unverified", "in_sync": False, "receipt": False}, {}])
def test_verification_never_makes_a_pass_of_a_drift_check_that_was_not_verified(result):
    made = rec.verification([{"skipped": True}, {"skipped": True}, drift(**result) if result else None])
    assert made.get("verdict") != "pass" and not made.get("verified")


@pytest.mark.parametrize("restarted", [True, False])
def test_an_unverified_process_has_no_invocation_and_restarted_is_what_the_step_did(restarted):
    """sglang_verify off: the drift check's invocation is the process before (a restart replaced it):
    never reported as the running one; whether the process is new is what the step did."""
    made = rec.verification([{"skipped": True}, {"skipped": True}, drift(verdict="drifted", in_sync=False)],
                            restarted=restarted)
    assert made["verdict"] == rec.NOT_VERIFIED and made["verified"] is False
    assert made["invocation_id"] is None and made["observed"] is None
    assert made["previous_invocation"] == drift()["invocation_id"] and made["restarted"] is restarted
    assert ("was restarted or started" in made["msg"]) is restarted
    assert rec.verification([{}, {}, drift()])["restarted"] is False  # default: nothing restarted
