"""Canary analysis in a rollout (issue 31), on the lab with the real sglang-router.

A setting that verifies perfectly but decodes 2x slower on the canary (the simulator's slow_decode
fault, on that host only) is caught by the analysis after the first batch: the canary is reverted
(verified) and back in the router, the rollout stops, the later hosts are untouched, and the report
(JSON, Markdown, PNG) is in the run's copy. Detection and false-alarm rates over many runs are
measured by `make bench` (tests/benchmarks/bench_canary.py), not here.
"""
from __future__ import annotations

import json

from rollout_support import SIM_ENV, Records, assert_records_consistent, assert_runs, describe, fleet_state
from rollout_support import fleet_of, lab, make_inventory, need_router  # noqa: F401 pylint: disable=unused-import
from test_rollout_safety import NEW, OLD, finished, rollout

# small but honest: 4 rounds of 16 streamed requests per host
WORKLOAD = {"num_prompts": 16, "max_concurrency": 4, "input_len": 64, "output_len": 96}


def test_a_canary_that_decodes_twice_slower_is_caught_reverted_and_reported(
        fleet_of, lab, lab_hosts, need_router, tmp_path):  # pylint: disable=redefined-outer-name
    hosts = lab_hosts[:3]
    canary, baseline, third = hosts
    inv, before = fleet_of(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW, rollout_analysis=True, rollout_analysis_rounds=4,
                 rollout_analysis_workload=WORKLOAD)
    inv.set_host_vars(canary["name"], sglang_environment=SIM_ENV | {"SGLANG_SIM_FAULT": "slow_decode=2"})
    run = finished(rollout(inv, tmp_path / "results", hosts))
    after = fleet_state(lab, lab_hosts, need_router)

    assert run.rc != 0, run
    assert f"{canary['name']} will be compared with {baseline['name']}" in run.out, run
    records = Records(tmp_path / "results")
    recs = assert_records_consistent(records, records.only_run())
    record = recs[canary["name"]]
    assert record["status"] == "reverted" and record["analysis"]["verdict"] == "regression", record
    assert record["analysis"]["baseline"] == baseline["name"], record
    assert f"canary analysis of {canary['name']} against {baseline['name']}: regression" in run.out, run
    # the canary runs the previous settings again, verified and in the router; the others never changed
    assert_runs(after[canary["name"]], OLD, in_router=True)
    assert after[canary["name"]]["invocation"] != before[canary["name"]]["invocation"], describe(after[canary["name"]])
    for host in (baseline, third):
        assert after[host["name"]]["invocation"] == before[host["name"]]["invocation"], describe(after[host["name"]])
        assert_runs(after[host["name"]], OLD, in_router=True)
        assert recs[host["name"]]["status"] == "pending", recs[host["name"]]
    # the report: both sides per metric, the throughput drop among the regressions, and the chart
    report = record["analysis"]["report"]
    result = json.loads(open(report["json"], encoding="utf-8").read())
    regressions = {row["metric"] for row in result["metrics"] if row["verdict"] == "regression"}
    assert "output_throughput" in regressions or "tpot_p50" in regressions, result["metrics"]
    assert result["canary"]["name"] == canary["name"] and result["baseline"]["name"] == baseline["name"]
    assert "| output throughput" in open(report["markdown"], encoding="utf-8").read()
    assert report["png"] and open(report["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    print(f"\ncanary analysis on the lab: {record['analysis']['message']} ({run.seconds:.1f} s)")
