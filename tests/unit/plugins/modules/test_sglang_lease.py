# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lease and the record on a host (files under tmp_path): held, renewed, refused, released, read."""
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.modules import sglang_lease

from fakes import ModuleExit, module_with_args

NOW = 1764410400.0
ALICE = {"kind": "rollout", "run_id": "r-alice", "session": "s-alice", "controller": "bastion-1", "user": "alice"}
BOB = {"kind": "sweep", "run_id": "sw-bob", "session": "s-bob", "controller": "awx-7f3a", "user": "bob", "job": "42"}


def call(monkeypatch, tmp_path, now=NOW, check_mode=False, **args):
    args.setdefault("unit", "sglang.service")
    args.setdefault("directory", str(tmp_path / "fleet"))
    module = module_with_args(monkeypatch, sglang_lease.ARGUMENT_SPEC, args, check_mode=check_mode,
                              required_if=sglang_lease.REQUIRED_IF)
    try:
        return sglang_lease.run(module, now=now), False
    except ModuleExit as done:
        return done.result, done.failed


def test_held_then_renewed_then_released_with_the_record_of_each_step(monkeypatch, tmp_path):
    first, failed = call(monkeypatch, tmp_path, holder=ALICE, seconds=60, intent_digest="d1",
                         record={"run_id": "r-alice", "kind": "rollout", "step": "prepared", "status": "pending"})
    assert not failed and first["action"] == "acquire" and first["changed"]
    generation = first["lease"]["generation"]
    assert first["lease"]["live"] and first["record"]["steps"][0]["step"] == "prepared"
    mine = dict(ALICE, generation=generation)
    renewed, failed = call(monkeypatch, tmp_path, now=NOW + 50, holder=mine, seconds=60,
                           record={"run_id": "r-alice", "step": "draining", "drained_by": "r-alice"})
    assert renewed["action"] == "renew" and renewed["lease"]["expires_in"] == 60.0
    assert [step["step"] for step in renewed["record"]["steps"]] == ["prepared", "draining"]
    done, failed = call(monkeypatch, tmp_path, now=NOW + 55, state="released", holder=mine,
                        record={"run_id": "r-alice", "step": "rejoined", "status": "updated", "drained_by": None})
    assert done["action"] == "release" and not done["lease"]["live"] and done["record"]["status"] == "updated"
    on_disk = json.loads((tmp_path / "fleet" / "sglang.service.record.json").read_text())
    assert on_disk["drained_by"] is None and len(on_disk["steps"]) == 3


def test_a_live_lease_of_another_holder_fails_naming_it_and_changes_nothing(monkeypatch, tmp_path):
    call(monkeypatch, tmp_path, holder=ALICE, seconds=300)
    before = (tmp_path / "fleet" / "sglang.service.lease.json").read_text()
    result, failed = call(monkeypatch, tmp_path, now=NOW + 10, holder=BOB, record={"run_id": "sw-bob", "step": "x"})
    assert failed and result["action"] == "refused"
    assert "the host is leased by rollout r-alice on bastion-1 by alice" in result["msg"]
    assert (tmp_path / "fleet" / "sglang.service.lease.json").read_text() == before
    assert not (tmp_path / "fleet" / "sglang.service.record.json").exists()


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew_it(monkeypatch, tmp_path):
    first, dummy = call(monkeypatch, tmp_path, holder=ALICE, seconds=30)
    taken, failed = call(monkeypatch, tmp_path, now=NOW + 31, holder=BOB, seconds=30)
    assert not failed and taken["action"] == "take_over" and "expired 1s ago" in taken["note"]
    again, failed = call(monkeypatch, tmp_path, now=NOW + 40,
                         holder=dict(ALICE, generation=first["lease"]["generation"]))
    assert failed and "this run's lease of the host was taken over" in again["msg"]
    assert "sweep sw-bob on awx-7f3a by bob (AWX job 42)" in again["msg"]


def test_query_and_check_mode_write_nothing(monkeypatch, tmp_path):
    result, failed = call(monkeypatch, tmp_path, state="query")
    assert result == {"changed": False, "action": "none", "lease": None, "record": None}
    result, failed = call(monkeypatch, tmp_path, check_mode=True, holder=ALICE, record={"step": "x"})
    assert result["changed"] and result["action"] == "acquire" and not (tmp_path / "fleet").exists()


def test_a_holder_is_required_to_hold_or_release(monkeypatch, tmp_path):
    with pytest.raises(ModuleExit) as refused:
        call_without_holder(monkeypatch, tmp_path)
    assert "holder" in refused.value.result["msg"]


def call_without_holder(monkeypatch, tmp_path):
    return module_with_args(monkeypatch, sglang_lease.ARGUMENT_SPEC, {"unit": "u", "state": "held"},
                            required_if=sglang_lease.REQUIRED_IF)
