"""Fleet playbooks against the lab: rollout (good change, bad change, zero downtime through a real
sglang-router), verify (drift) and sweep. No mocks: systemd-nspawn hosts, the SGLang simulator,
the real router from the inventory (sglang_router_url).

Every test deploys what it needs on clean hosts (clean_fleet) and leaves the router without the
lab hosts' workers (router_clean). Settings go into group_vars/host_vars of a per-test inventory
(lab_inventory_dir), not extra vars: extra vars would override a sweep's per-combination values.
"""
from __future__ import annotations

import csv
import io
import json
import re
import threading
import time

import pytest
import requests
from lab_support import ansible_playbook
from rollout_support import (APPLY_PLAY, LOAD_SECONDS, SIM_ENV, Records, assert_record_matches_host,
                             assert_records_consistent, assert_runs, config_line, describe, fleet_state, invocations,
                             journal_time, play_batches, router_workers)
# Fixtures (pytest finds them in this module's namespace).
from rollout_support import fleet_inv, lab  # noqa: F401 pylint: disable=unused-import


def unit_invocations(sh, host: dict) -> list[str]:
    """The unit's invocations in the order they logged, oldest first."""
    out = sh(host, "journalctl -u sglang.service -o json --output-fields=_SYSTEMD_INVOCATION_ID --no-pager")
    seen = []
    for line in out.splitlines():
        invocation = json.loads(line).get("_SYSTEMD_INVOCATION_ID")
        if invocation and invocation not in seen:
            seen.append(invocation)
    return seen


# ------------------------------------------------------------------ rollout

def test_rollout_good_change_canary_then_batches(clean_fleet, router_clean, fleet_inv, lab, lab_hosts,
                                                 sh, tmp_path):
    hosts_yml, set_vars, _inventory_dir, deploy = fleet_inv
    names = [h["name"] for h in lab_hosts]
    assert len(names) == 4, "this test expects a lab of 4 hosts"
    set_vars(sglang_speculative_draft_window_size=1024)
    deploy(join_router=True)
    before = fleet_state(lab, lab_hosts, router_clean)

    set_vars(sglang_speculative_draft_window_size=2048)
    results = tmp_path / "results"
    started = time.time()
    run = ansible_playbook(hosts_yml, "playbooks/rollout.yml", {"rollout_results_dir": str(results)})
    assert run.rc == 0, run
    after = fleet_state(lab, lab_hosts, router_clean)

    records = Records(results)
    run_id = records.only_run()
    recs = assert_records_consistent(records, run_id)
    assert records.run(run_id)["batches"] == [1, "25%"] and records.lock() is None
    for name in names:
        rec, state = recs[name], after[name]
        assert rec["status"] == "updated" and rec["restarted"] is True, rec
        assert rec["old_invocation"] == before[name]["invocation"]
        assert rec["new_invocation"] == state["invocation"] != before[name]["invocation"], rec
        assert rec["observed"]["draft_window_size"] == 2048 and rec["observed"]["compact_cache"] is True
        assert_runs(state, 2048, in_router=True if router_clean else None)
        assert_record_matches_host(rec, state)
        assert state["last_good"]["invocation_id"] == state["invocation"], describe(state)
        host = next(h for h in lab_hosts if h["name"] == name)
        assert "draft_window_size=2048, compact_cache=True" in config_line(sh, host, state["invocation"])

    # Batches: a canary of 1, then at most 25 % of the 4 hosts that change (1) - from the play
    # banners...
    assert play_batches(run.out, APPLY_PLAY) == [[n] for n in names], run
    # ...and from when each host's record was last written.
    done = [(results / run_id / f"{n}.json").stat().st_mtime for n in names]
    assert done == sorted(done), done
    batch_wall = [round(b - a, 1) for a, b in zip([started] + done[:-1], done)]
    print(f"\nrollout of 4 hosts: {run.seconds:.1f} s; batch wall times {batch_wall} s (canary incl. the "
          f"prepare phase); drained in { {n: recs[n].get('drained_seconds') for n in names} } s, ready after "
          f"restart { {n: recs[n]['time_to_ready'] for n in names} } s; simulated load {LOAD_SECONDS} s")


def test_rollout_bad_change_stops_reverts_and_names_the_flag(clean_fleet, router_clean, fleet_inv, lab,
                                                             lab_hosts, sh, tmp_path):
    hosts_yml, set_vars, set_host_vars, deploy = fleet_inv
    h1, h2, h3, h4 = lab_hosts[:4]
    set_vars(sglang_speculative_draft_window_size=1024)
    deploy(join_router=True)
    before = fleet_state(lab, lab_hosts, router_clean)

    # The change: window 2048. Host 2's SGLang ignores the window (parses the flag, runs without).
    set_vars(sglang_speculative_draft_window_size=2048)
    set_host_vars(h2["name"], sglang_environment={"SGLANG_SIM_LOAD_SECONDS": LOAD_SECONDS,
                                                  "SGLANG_SIM_DRAIN_POLL_SECONDS": "1",
                                                  "SGLANG_SIM_FAULT": "ignore_window"})
    results = tmp_path / "results"
    run = ansible_playbook(hosts_yml, "playbooks/rollout.yml", {"rollout_results_dir": str(results)})
    after = fleet_state(lab, lab_hosts, router_clean)
    in_router = True if router_clean else None

    assert run.rc != 0, run
    stop = re.search(r"Rollout stopped at (\S+): (.*)", run.out)
    assert stop and stop.group(1) == h2["name"] and "draft_window_size" in stop.group(2), run
    records = Records(results)
    run_id = records.only_run()
    recs = assert_records_consistent(records, run_id)
    assert records.run(run_id)["status"] == "failed" and records.lock() is None

    # Host 1: updated and verified on the new window.
    rec1 = recs[h1["name"]]
    assert rec1["status"] == "updated" and rec1["observed"]["draft_window_size"] == 2048
    assert_runs(after[h1["name"]], 2048, in_router=in_router)
    assert_record_matches_host(rec1, after[h1["name"]])

    # Host 2: the new process disagreed, was reverted to the last-known-good unit and verified.
    rec2 = recs[h2["name"]]
    assert rec2["status"] == "reverted" and "draft_window_size" in rec2["error"], rec2
    assert rec2["failed_step"] == "applying" and rec2["reverted"] is True and rec2["revert"]["healthy"], rec2
    assert rec2["revert"]["observed"]["draft_window_size"] == 1024, rec2
    assert after[h2["name"]]["invocation"] == rec2["revert"]["invocation_id"]
    assert_runs(after[h2["name"]], 1024, in_router=in_router)  # back in the router, reverted
    assert_record_matches_host(rec2, after[h2["name"]])
    # Its unit logged three invocations: the one before, the bad one (no window), the reverted one.
    first, bad, reverted = unit_invocations(sh, h2)[-3:]
    assert first == before[h2["name"]]["invocation"] and reverted == after[h2["name"]]["invocation"]
    assert "draft_window_size=None" in config_line(sh, h2, bad)
    assert "draft_window_size=1024, compact_cache=True" in config_line(sh, h2, reverted)
    # Its last-known-good is still the unit it ran before (adopted before the change).
    assert after[h2["name"]]["last_good"]["invocation_id"] == before[h2["name"]]["invocation"]

    # Hosts 3 and 4: never touched; their records say they were not reached.
    for host in (h3, h4):
        state = after[host["name"]]
        assert state["invocation"] == before[host["name"]]["invocation"]
        assert_runs(state, 1024, in_router=in_router)
        rec = recs[host["name"]]
        assert rec["status"] == "pending" and [s["step"] for s in rec["steps"]] == ["prepared"], rec
        # what the role deployed and verified, untouched by the rollout
        assert state["last_good"]["invocation_id"] == before[host["name"]]["invocation"], describe(state)


def test_rollout_through_the_router_drops_no_request(clean_fleet, router_clean, fleet_inv, lab, lab_hosts,
                                                     state_of, sh, tmp_path):
    if not router_clean:
        pytest.skip("the lab inventory sets no sglang_router_url (lab.py up --router)")
    router = router_clean
    hosts_yml, set_vars, _inventory_dir, deploy = fleet_inv
    three = lab_hosts[:3]
    limit = ",".join(h["name"] for h in three)
    set_vars(sglang_speculative_draft_window_size=1024)
    deploy(limit=limit, join_router=True)
    worker_of = {h["name"]: f"http://{h['address']}:30000" for h in three}
    assert {w["url"] for w in router_workers(router)} >= set(worker_of.values())
    before = invocations(three, state_of)

    stop = threading.Event()
    requests_log = []  # (sent, answered, ok, sim_worker or error)
    snapshots = []     # (time, {worker urls listed by the router})

    def client():
        session = requests.Session()
        while not stop.is_set():
            sent = time.time()
            try:
                resp = session.post(f"{router}/generate", timeout=60, json={
                    "text": "The capital of France is",
                    "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
                body = resp.json() if resp.status_code == 200 else {}
                ok = resp.status_code == 200 and bool(body.get("text"))
                who = body.get("meta_info", {}).get("sim_worker") if ok else f"HTTP {resp.status_code} {resp.text[:200]}"
            except Exception as exc:  # noqa: BLE001 - every failure counts
                ok, who = False, repr(exc)
            requests_log.append((sent, time.time(), ok, who))

    def poll_router():
        while not stop.is_set():
            try:
                snapshots.append((time.time(), {w["url"] for w in router_workers(router)}))
            except Exception:  # noqa: BLE001 - a missed snapshot proves nothing either way
                pass
            time.sleep(0.1)

    threads = [threading.Thread(target=client, daemon=True) for _i in range(2)]
    threads.append(threading.Thread(target=poll_router, daemon=True))
    for t in threads:
        t.start()
    try:
        time.sleep(1)
        set_vars(sglang_speculative_draft_window_size=2048)
        run = ansible_playbook(hosts_yml, "playbooks/rollout.yml",
                               {"rollout_results_dir": str(tmp_path / "results"), "rollout_batches": [1]},
                               limit=f"{limit},localhost")
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=90)
    assert run.rc == 0, run
    after = invocations(three, state_of)

    failed = [r for r in requests_log if not r[2]]
    served = {r[3] for r in requests_log if r[2]}
    print(f"\nzero-downtime rollout of 3 hosts ({run.seconds:.1f} s): {len(requests_log)} requests "
          f"through the router, {len(failed)} failed; served by {sorted(served)}")
    assert len(requests_log) > 50 and not failed, failed[:5]
    assert play_batches(run.out, APPLY_PLAY) == [[h["name"]] for h in three], run
    records = Records(tmp_path / "results")
    recs = assert_records_consistent(records, records.only_run())
    state = fleet_state(lab, three, router)
    for host in three:
        assert recs[host["name"]]["status"] == "updated", recs[host["name"]]
        assert_runs(state[host["name"]], 2048, in_router=True)
        assert_record_matches_host(recs[host["name"]], state[host["name"]])

    for host in three:
        name, worker = host["name"], worker_of[host["name"]]
        assert after[name] != before[name]
        # The restart: from SIGTERM to the old process until the new one is fired up.
        down = journal_time(sh, host, before[name], "SIGTERM received")
        up = journal_time(sh, host, after[name], "The server is fired up and ready to roll")
        assert down and up and down < up, (name, down, up)
        during = [s for s in snapshots if down - 0.5 <= s[0] <= up]
        assert during, f"no router snapshot while {name} restarted"
        assert not [s for s in during if worker in s[1]], f"router listed {name} while it restarted"
        # No request was in flight on that host across its restart.
        sim_worker = f"{host['address']}:30000"
        overlapping = [r for r in requests_log if r[3] == sim_worker and r[0] < up and r[1] > down]
        assert not overlapping, (name, overlapping[:3])
        # ... and it served traffic again afterwards.
        assert any(r[3] == sim_worker and r[0] > up for r in requests_log), f"{name} never rejoined"
        print(f"  {name}: out of the router for the whole restart ({up - down:.1f} s, "
              f"{len(during)} router snapshots without it)")


def generate(url: str, api_key: str | None = None) -> tuple[int, str]:
    """(HTTP status, who answered) of one POST /generate (the simulator names its worker)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = requests.post(f"{url}/generate", headers=headers, timeout=60, json={
        "text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    body = resp.json() if resp.status_code == 200 else {}
    return resp.status_code, body.get("meta_info", {}).get("sim_worker") or resp.text[:120]


def test_a_rollout_of_key_protected_servers_leaves_the_router_able_to_call_them(
        clean_fleet, router_clean, fleet_inv, lab_hosts, state_of, tmp_path):  # pylint: disable=too-many-locals
    """Servers with sglang_api_key behind the router. The router calls a worker with the key it was
    given when the worker was added; its health check (/health) is open without one. Found in review:
    the rollout drained each host without the key (/v1/loads answers 401: the rollout stopped at the
    canary) and put it back without its key (the router would list it healthy and forward requests
    that are refused). Now it drains and re-adds each worker with the server's key. A key rotation:
    the running process refuses the new key, so without /metrics (open without a key) the drain
    cannot count in-flight requests - the rollout stops at the canary before changing it, naming the
    remedy; with --enable-metrics the rotation goes through. A rotation whose new settings fail on the
    canary reverts it to the previous key, verifies the revert with that key (read on the host from the
    restored config file) and leaves it out of the router, which would call it with the new key. No key
    is printed or recorded."""
    router = router_clean
    hosts_yml, set_vars, set_host_vars, deploy = fleet_inv
    two = lab_hosts[:2]
    limit = ",".join(h["name"] for h in two)
    direct = {h["name"]: f"http://{h['address']}:30000" for h in two}
    served_by = {f"{h['address']}:30000" for h in two}
    old_key, new_key, third_key = "gpfOldKeyR7Tq", "gpfNewKeyW3Zm", "gpfThirdKeyP5Lx"
    metrics = {"--enable-metrics": True}

    def through_router(what, by=served_by):
        answers = [generate(router) for _i in range(8)]
        assert all(status == 200 for status, _who in answers), (what, answers)
        assert {who for _s, who in answers} == by, (what, answers)

    def roll(name, window, key, extra_args=None):
        set_vars(sglang_speculative_draft_window_size=window, sglang_api_key=key, sglang_extra_args=extra_args or {})
        results = tmp_path / f"results-{name}"
        run = ansible_playbook(hosts_yml, "playbooks/rollout.yml",
                               {"rollout_results_dir": str(results), "rollout_batches": [1]},
                               limit=f"{limit},localhost")
        for text in [run.out] + [path.read_text() for path in results.rglob("*.json")]:
            assert not [k for k in (old_key, new_key, third_key) if k in text], name
        records = Records(results)
        return run, assert_records_consistent(records, records.only_run())

    set_vars(sglang_speculative_draft_window_size=1024, sglang_api_key=old_key)
    deploy(limit=limit, join_router=True)
    through_router("deployed")

    # A change with the same key: drained and re-added with it; the router still calls both.
    run, recs = roll("change", 2048, old_key)
    assert run.rc == 0, run.out[-5000:]
    assert [recs[h["name"]]["status"] for h in two] == ["updated", "updated"], recs
    through_router("after the change")

    # A rotation without /metrics: stopped at the canary's drain before the router forgot the worker
    # (and its key): nothing changed, every request still served.
    before = invocations(two, state_of)
    run, recs = roll("rotation-without-metrics", 4096, new_key)
    assert run.rc != 0, run.out[-3000:]
    canary = recs[two[0]["name"]]
    assert canary["failed_step"] == "draining" and canary["in_router"] is True, canary
    assert "HTTP 401" in canary["error"] and "--enable-metrics" in canary["error"], canary
    assert "nothing on the host had changed" in canary["message"], canary
    assert invocations(two, state_of) == before
    through_router("after the stopped rotation")
    for url in direct.values():
        assert generate(url, old_key)[0] == 200 and generate(url, new_key)[0] == 401

    # With --enable-metrics (a change of its own first), the rotation goes through.
    run, recs = roll("metrics", 2048, old_key, metrics)
    assert run.rc == 0, run.out[-5000:]
    run, recs = roll("rotation", 4096, new_key, metrics)
    assert run.rc == 0, run.out[-5000:]
    assert [recs[h["name"]]["status"] for h in two] == ["updated", "updated"], recs
    through_router("after the rotation")
    for url in direct.values():
        assert generate(url, new_key)[0] == 200 and generate(url, old_key)[0] == 401 and generate(url)[0] == 401

    # A rotation whose new settings fail on the canary (its SGLang ignores the window).
    canary, other = two
    set_host_vars(canary["name"], sglang_environment=dict(SIM_ENV, SGLANG_SIM_FAULT="ignore_window"))
    run, recs = roll("failed-rotation", 2048, third_key, metrics)
    assert run.rc != 0, run.out[-3000:]
    record = recs[canary["name"]]
    assert record["status"] == "reverted" and record["reverted"] is True and record["in_router"] is False, record
    assert "NOT back in the router: the host was reverted to the previous API key" in record["outcome"], record
    assert generate(direct[canary["name"]], new_key)[0] == 200  # it serves, with its restored key
    assert generate(direct[canary["name"]], third_key)[0] == 401
    assert {w["url"] for w in router_workers(router)} == {direct[other["name"]]}
    through_router("after the failed rotation", by={f"{other['address']}:30000"})

    # A change that removes the key fails on the canary: reverted to the unit with --config (its key read
    # from that file on the host), and left out of the router, which would call it without a key.
    run, recs = roll("failed-removal", 1024, "", metrics)
    assert run.rc != 0, run.out[-3000:]
    record = recs[canary["name"]]
    assert record["status"] == "reverted" and record["in_router"] is False, record
    assert "NOT back in the router: the host was reverted to the previous API key" in record["outcome"], record
    assert generate(direct[canary["name"]], new_key)[0] == 200 and generate(direct[canary["name"]])[0] == 401
    through_router("after the failed removal", by={f"{other['address']}:30000"})


# ------------------------------------------------------------------ verify

def test_verify_reports_drift_and_changes_nothing(clean_fleet, fleet_inv, lab_hosts, state_of, sh,
                                                  tmp_path):
    hosts_yml, set_vars, _inventory_dir, deploy = fleet_inv
    names = [h["name"] for h in lab_hosts]
    set_vars()
    deploy()
    results = tmp_path / "verify"

    def verify(check=False):
        before = invocations(lab_hosts, state_of)
        run = ansible_playbook(hosts_yml, "gpufleet.inference.verify", {"verify_results_dir": str(results)}, check=check)
        assert invocations(lab_hosts, state_of) == before, "verify restarted something"
        newest = max(results.iterdir(), key=lambda p: p.stat().st_mtime)
        return run, json.loads((newest / "summary.json").read_text())

    run, summary = verify()
    assert run.rc == 0, run
    assert sorted(summary["in_sync"]) == sorted(names) and not summary["drifted"]
    for name in names:  # one report line per host
        assert re.search(rf"^{re.escape(name)}: in sync \(invocation [0-9a-f]{{32}}\)$", run.out, re.M), run

    # Hand edit of host 1's unit, no restart: the unit drifted, the process not (yet).
    h1 = lab_hosts[0]
    unit_before = sh(h1, "cat /etc/systemd/system/sglang.service")
    sh(h1, "sed -i 's/\"2048\"/\"4096\"/' /etc/systemd/system/sglang.service && systemctl daemon-reload")
    run, summary = verify()
    assert run.rc != 0 and summary["drifted"] == [h1["name"]], run
    (rec,) = [r for r in summary["hosts"] if r["host"] == h1["name"]]
    # The file and what systemd would run (reloaded) differ; the running process does not (yet).
    assert [d["what"] for d in rec["differences"]] == ["file", "effective unit"], rec
    # A diff from what is installed (-) to what the role renders (+).
    assert re.fullmatch(r'-\s*"4096"; \+\s*"2048"', rec["differences"][0]["observed"]), rec
    assert rec["differences"][1]["expected"] == "2048" and rec["differences"][1]["observed"] == "4096", rec
    assert re.search(rf"^{re.escape(h1['name'])}: DRIFTED \(invocation {rec['invocation_id']}\); file "
                     r"/etc/systemd/system/sglang.service: expected as rendered by the role", run.out, re.M), run

    # ...then restarted by hand: the running process drifted too (also seen in check mode).
    old = state_of(h1)["InvocationID"]
    sh(h1, "systemctl restart sglang.service")
    deadline = time.monotonic() + 60
    while not journal_time(sh, h1, state_of(h1)["InvocationID"], "fired up and ready"):
        assert time.monotonic() < deadline, "hand-restarted server never came up"
        time.sleep(0.5)
    assert state_of(h1)["InvocationID"] != old
    run, summary = verify(check=True)
    assert run.rc != 0 and summary["drifted"] == [h1["name"]], run
    (rec,) = [r for r in summary["hosts"] if r["host"] == h1["name"]]
    found = {(d["what"], d["key"]): d for d in rec["differences"]}
    assert found[("config line", "draft_window_size")]["expected"] == 2048
    assert found[("config line", "draft_window_size")]["observed"] == 4096
    window_key = next(k for w, k in found if w == "server_info")
    assert "draft_window_size" in window_key and found[("server_info", window_key)]["observed"] == 4096
    report = " ".join(run.out.split())
    assert re.search(rf"Drift on {re.escape(h1['name'])}: .*config line draft_window_size: expected 2048, "
                     r"observed 4096", report), run
    assert re.search(rf"^{re.escape(h1['name'])}: DRIFTED \(invocation {state_of(h1)['InvocationID']}\); .*"
                     r"config line draft_window_size: expected 2048, observed 4096", run.out, re.M), run
    for name in names[1:]:
        assert name in summary["in_sync"]
    assert sh(h1, "cat /etc/systemd/system/sglang.service") != unit_before  # verify did not repair it
    print(f"\nverify of {len(names)} hosts: {run.seconds:.1f} s; drift reported: "
          + "; ".join(f"{d['what']} {d['key']}: {d['expected']} -> {d['observed']}" for d in rec["differences"]))


# ------------------------------------------------------------------ sweep

def test_sweep_measures_each_combination_once(clean_fleet, router_clean, fleet_inv, lab_hosts,
                                              state_of, sh, tmp_path):
    hosts_yml, set_vars, _inventory_dir, _deploy = fleet_inv
    set_vars()  # originals: window 2048, 16 draft tokens
    host = lab_hosts[0]  # sweep_host defaults to the first host of gpu
    results = tmp_path / "sweep"
    extra = {
        "sweep_results_dir": str(results),
        "sweep_matrix": {"sglang_speculative_draft_window_size": [None, 1024],
                         "sglang_speculative_num_draft_tokens": [8, 16]},
        "sweep_bench": {"num_prompts": 16, "max_concurrency": 4, "output_len": 64, "input_len": 32},
    }
    run = ansible_playbook(hosts_yml, "gpufleet.inference.sweep", extra)
    assert run.rc == 0, run
    assert "4 combination(s), 4 to measure" in " ".join(run.out.split()), run

    csv_text = (results / "results.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    combos = {(r["sglang_speculative_draft_window_size"], r["sglang_speculative_num_draft_tokens"]) for r in rows}
    assert combos == {("", "8"), ("", "16"), ("1024", "8"), ("1024", "16")}, csv_text
    for row in rows:
        assert row["status"] == "ok", row
        assert float(row["output_throughput"]) > 0 and float(row["median_ttft_ms"]) > 0, row
        assert float(row["median_tpot_ms"]) > 0 and float(row["p99_e2e_latency_ms"]) > 0, row
        assert int(row["completed"]) == 16 and int(row["failed_requests"]) == 0, row
        assert float(row["accept_length"]) > 1, row
        window = row["sglang_speculative_draft_window_size"] or "None"
        assert f"block_size={row['sglang_speculative_num_draft_tokens']} draft_window_size={window}" in row["observed"], row
    md = (results / "results.md").read_text()
    assert len([line for line in md.splitlines() if line.startswith("| ")]) == 1 + 4, md  # header + 4 rows
    assert (results / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Restored to the original settings (sweep_restore default: original).
    inv = state_of(host)["InvocationID"]
    assert "block_size=16, draft_window_size=2048, compact_cache=True" in config_line(sh, host, inv)

    # A re-run measures nothing: no restart, the CSV unchanged.
    files = {p.name: p.read_bytes() for p in results.iterdir()}
    rerun = ansible_playbook(hosts_yml, "gpufleet.inference.sweep", extra)
    assert rerun.rc == 0, rerun
    assert "4 combination(s), 0 to measure" in " ".join(rerun.out.split()), rerun
    assert "Benchmark the combination" not in rerun.out, rerun
    assert state_of(host)["InvocationID"] == inv
    assert {p.name: p.read_bytes() for p in results.iterdir()} == files
    print(f"\nsweep 2x2 on {host['name']}: {run.seconds:.1f} s, re-run {rerun.seconds:.1f} s\n{md}")
