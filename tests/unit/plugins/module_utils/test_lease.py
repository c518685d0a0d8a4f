# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's lease and record: who may change it, when a holder is dead, and what a writer leaves there."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _lease

NOW = 1764410400.0
ALICE = {"kind": "rollout", "run_id": "r-alice", "session": "s-alice", "controller": "bastion-1", "user": "alice",
         "job": None, "generation": None}
BOB = {"kind": "rollout", "run_id": "r-bob", "session": "s-bob", "controller": "awx-7f3a", "user": "bob", "job": "42",
       "generation": None}


def taken(holder=None, now=NOW, seconds=300):
    lease, action, note = _lease.take(None, holder or ALICE, now, seconds, "d1")
    assert action == "acquire" and note is None
    return lease


def test_a_free_host_is_leased_naming_its_holder():
    lease = taken()
    assert lease["holder"] == {"kind": "rollout", "run_id": "r-alice", "controller": "bastion-1", "user": "alice",
                               "job": None, "process": None}
    assert (lease["generation"], lease["acquired"], lease["expires"], lease["intent_digest"]) == (1, NOW, NOW + 300, "d1")
    assert _lease.live(lease, NOW + 299) and not _lease.live(lease, NOW + 300)


def test_a_live_lease_of_another_session_is_refused_naming_the_holder_wherever_it_runs():
    with pytest.raises(_lease.LeaseError) as refused:
        _lease.take(taken(), BOB, NOW + 10, 300)
    text = str(refused.value)
    assert "rollout r-alice on bastion-1 by alice" in text and "expires in 290s" in text


def test_a_dead_holder_is_one_whose_lease_expired_never_one_on_another_machine():
    lease, action, note = _lease.take(taken(), BOB, NOW + 301, 300)
    assert action == "take_over" and "expired 1s ago" in note
    assert lease["generation"] == 2 and lease["holder"]["run_id"] == "r-bob"
    assert lease["previous"]["holder"]["run_id"] == "r-alice"


def test_breaking_a_live_lease_is_explicit():
    lease, action, note = _lease.take(taken(), BOB, NOW + 10, 300, force=True)
    assert action == "break" and "broke the live lease of rollout r-alice" in note


def test_the_holder_renews_its_own_lease_even_after_it_expired_if_nobody_took_it():
    lease = taken()
    mine = dict(ALICE, generation=1)
    renewed, action, dummy = _lease.take(lease, mine, NOW + 400, 300)
    assert action == "renew" and renewed["expires"] == NOW + 700 and renewed["generation"] == 1


def test_a_lease_taken_over_is_never_renewed_even_after_its_new_holder_released_it():
    lease = taken()
    bobs, dummy, dummy = _lease.take(lease, BOB, NOW + 301, 300)
    released, done = _lease.release(bobs, dict(BOB, generation=2), NOW + 310)
    assert done and released["released"] and not _lease.live(released, NOW + 311)
    for current in (bobs, released):
        with pytest.raises(_lease.LeaseError, match="was taken over"):
            _lease.take(current, dict(ALICE, generation=1), NOW + 320, 300)


def test_only_the_holder_releases():
    lease = taken()
    same, done = _lease.release(lease, BOB, NOW + 1)
    assert not done and same is lease
    released, done = _lease.release(lease, ALICE, NOW + 1)
    assert done and released["released_at"] == NOW + 1
    assert _lease.take(released, BOB, NOW + 2, 60)[1] == "acquire"  # free again


def test_the_record_keeps_a_runs_steps_and_moves_an_earlier_run_to_history():
    record = _lease.merge_record(None, {"run_id": "r1", "kind": "rollout", "step": "draining", "status": "in progress",
                                        "drained_by": "r1"}, NOW)
    record = _lease.merge_record(record, {"run_id": "r1", "step": "rejoined", "status": "updated",
                                          "drained_by": None}, NOW + 5)
    assert [step["step"] for step in record["steps"]] == ["draining", "rejoined"]
    assert record["status"] == "updated" and record["drained_by"] is None and record["updated"] == NOW + 5
    record = _lease.merge_record(record, {"run_id": "r2", "kind": "sweep", "step": "started"}, NOW + 9)
    assert record["run_id"] == "r2" and [step["step"] for step in record["steps"]] == ["started"]
    assert record["history"][0]["run_id"] == "r1" and record["history"][0]["status"] == "updated"


def test_the_view_says_whether_it_binds_and_for_how_long():
    view = _lease.view(taken(), NOW + 100)
    assert view["live"] is True and view["expires_in"] == 200.0 and "rollout r-alice" in view["text"]
    assert _lease.view(None, NOW) is None


def test_files_and_lock(tmp_path):
    files = _lease.paths(str(tmp_path / "fleet"), "sglang.service")
    with _lease.locked(str(tmp_path / "fleet"), "sglang.service"):
        _lease.write(files["lease"], taken())
    assert _lease.read(files["lease"])["holder"]["run_id"] == "r-alice"
    assert _lease.read(files["record"]) is None
    (tmp_path / "fleet" / "x.json").write_text("[not a dict]")
    assert _lease.read(str(tmp_path / "fleet" / "x.json")) is None


def test_a_run_found_dead_has_its_remaining_leases_taken_over_by_the_run_that_resumes_it():
    # alice's run left hosts mid-change and died; its leases of hosts it had not reached are still live
    pending = taken(seconds=3600)
    resumed = dict(BOB, run_id="r-alice")
    lease, action, note = _lease.take(pending, resumed, NOW + 10, 300, takeover_runs=["r-alice"])
    assert action == "take_over" and "took over the lease of run r-alice, whose controller is gone" in note
    assert lease["session"] == "s-bob" and lease["generation"] == 2
    # only the run named: another live run's lease still refuses
    with pytest.raises(_lease.LeaseError):
        _lease.take(pending, resumed, NOW + 10, 300, takeover_runs=["r-other"])
