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
import yaml
from lab_support import ansible_playbook

LOAD_SECONDS = "2"  # simulated weight loading; the code under test is sized for minutes
# The simulator's SIGTERM watchdog polls every 5 s by default (like SGLang's): 1 s keeps stops short.
SIM_ENV = {"SGLANG_SIM_LOAD_SECONDS": LOAD_SECONDS, "SGLANG_SIM_DRAIN_POLL_SECONDS": "1"}


# ------------------------------------------------------------------ helpers

# Parallel first install (no canary needed on clean hosts), optionally joining the router.
DEPLOY = """
- name: Deploy SGLang on clean lab hosts
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Apply the role
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
    - name: Join the router
      gpufleet.inference.sglang_router_worker:
        router_url: "{{ sglang_router_url }}"
        worker_url: "http://{{ sglang_host }}:{{ sglang_port | default(30000) }}"
        state: present
      delegate_to: localhost
      when: join_router | default(false) | bool and sglang_router_url | default('') | length > 0
"""


@pytest.fixture
def fleet_inv(lab_inventory_dir, server_vars, tmp_path):
    """(hosts.yml, set_vars(**over), set_host_vars(name, **vars), deploy(limit, join_router))."""
    hosts_yml, write = lab_inventory_dir
    deploy_pb = tmp_path / "deploy.yml"
    deploy_pb.write_text(DEPLOY)

    def set_vars(**over):
        data = server_vars(sglang_environment=SIM_ENV,
                           sglang_ready_timeout=90) | over
        write("group_vars", "gpu", data)
        return data

    def set_host_vars(name, **data):
        write("host_vars", name, data)

    def deploy(limit=None, join_router=False):
        run = ansible_playbook(hosts_yml, str(deploy_pb), {"join_router": join_router}, limit=limit)
        assert run.rc == 0, run
        return run

    return hosts_yml, set_vars, set_host_vars, deploy


@pytest.fixture(scope="session")
def router_url(lab_inventory):
    data = yaml.safe_load(lab_inventory.read_text())
    return (data["all"]["children"]["gpu"].get("vars") or {}).get("sglang_router_url") or ""


def router_workers(url: str) -> list[dict]:
    return requests.get(f"{url}/workers", timeout=5).json().get("workers", [])


@pytest.fixture
def router_clean(router_url, lab_hosts):
    """No worker of a lab host in the router before and after the test (only this lab's hosts)."""
    addresses = {h["address"] for h in lab_hosts}

    def clean():
        if not router_url:
            return
        for worker in router_workers(router_url):
            if any(f"//{a}:" in worker["url"] for a in addresses):
                requests.delete(f"{router_url}/workers/{worker['id']}", timeout=5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not any(any(f"//{a}:" in w["url"] for a in addresses) for w in router_workers(router_url)):
                return
            time.sleep(0.3)
        raise AssertionError(f"router still lists lab workers: {router_workers(router_url)}")
    clean()
    yield router_url
    clean()


def invocations(lab_hosts, state_of) -> dict:
    return {h["name"]: state_of(h)["InvocationID"] for h in lab_hosts}


def config_line(sh, host: dict, invocation: str) -> str:
    """The config line logged by one invocation (never the unit's older ones)."""
    return sh(host, f"journalctl _SYSTEMD_INVOCATION_ID={invocation} -o cat --no-pager"
                    " | grep 'Initialized DFLASH draft runner' || true").strip()


def journal_time(sh, host: dict, invocation: str, text: str) -> float | None:
    """Wall-clock time (s) of the first line of an invocation containing text."""
    out = sh(host, f"journalctl _SYSTEMD_INVOCATION_ID={invocation} -o json --no-pager"
                   f" --grep {json.dumps(text)} || true")
    for line in out.splitlines():
        entry = json.loads(line)
        return int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    return None


def play_batches(out: str, play_name: str) -> list[list[str]]:
    """Hosts of each serial batch of a play, in order, from the play's banners in the output."""
    chunks = re.split(r"^PLAY \[(.*?)\] \*+$", out, flags=re.M)
    batches = []
    for name, body in zip(chunks[1::2], chunks[2::2]):
        if name != play_name:
            continue
        hosts = []
        for host in re.findall(r"^(?:ok|changed|included|fatal|failed): \[?([^\]\s]+?)(?: -> \S+)?\]", body, re.M):
            if host not in hosts and host != "localhost":
                hosts.append(host)
        batches.append(hosts)
    return batches


ROLLOUT_PLAY = "Roll SGLang settings out, batch by batch"


# ------------------------------------------------------------------ rollout

def test_rollout_good_change_canary_then_batches(clean_fleet, router_clean, fleet_inv, lab_hosts,
                                                 state_of, sh, tmp_path):
    hosts_yml, set_vars, _inventory_dir, deploy = fleet_inv
    names = [h["name"] for h in lab_hosts]
    assert len(names) == 4, "this test expects a lab of 4 hosts"
    set_vars(sglang_speculative_draft_window_size=1024)
    deploy(join_router=True)
    before = invocations(lab_hosts, state_of)

    set_vars(sglang_speculative_draft_window_size=2048)
    results = tmp_path / "results"
    started = time.time()
    run = ansible_playbook(hosts_yml, "playbooks/rollout.yml", {"rollout_results_dir": str(results)})
    assert run.rc == 0, run
    after = invocations(lab_hosts, state_of)

    (run_dir,) = list(results.iterdir())
    records = {n: json.loads((run_dir / f"{n}.json").read_text()) for n in names}
    for name in names:
        rec = records[name]
        assert rec["status"] == "updated", rec
        assert rec["old_invocation"] == before[name] and rec["new_invocation"] == after[name] != before[name]
        assert rec["observed"]["draft_window_size"] == 2048 and rec["observed"]["compact_cache"] is True
        host = next(h for h in lab_hosts if h["name"] == name)
        assert "draft_window_size=2048, compact_cache=True" in config_line(sh, host, after[name])

    # Batches: canary 1, then 25 % (1), then the rest (2) - from the play banners...
    assert play_batches(run.out, ROLLOUT_PLAY) == [[names[0]], [names[1]], [names[2], names[3]]], run
    # ...and from when each host's result was written.
    done = {n: (run_dir / f"{n}.json").stat().st_mtime for n in names}
    assert done[names[0]] < done[names[1]] < min(done[names[2]], done[names[3]])
    batch_end = [done[names[0]], done[names[1]], max(done[names[2]], done[names[3]])]
    batch_wall = [round(b - a, 1) for a, b in zip([started] + batch_end[:-1], batch_end)]
    print(f"\nrollout of 4 hosts: {run.seconds:.1f} s; batch wall times {batch_wall} s "
          f"(canary incl. play start, 25 %, rest); per host wall "
          f"{ {n: records[n]['wall_seconds'] for n in names} } s, ready after restart "
          f"{ {n: records[n]['time_to_ready'] for n in names} } s; simulated load {LOAD_SECONDS} s")


def test_rollout_bad_change_stops_reverts_and_names_the_flag(clean_fleet, router_clean, fleet_inv,
                                                             lab_hosts, state_of, sh, tmp_path):
    hosts_yml, set_vars, set_host_vars, deploy = fleet_inv
    h1, h2, h3, h4 = lab_hosts[:4]
    set_vars(sglang_speculative_draft_window_size=1024)
    deploy(join_router=True)
    before = invocations(lab_hosts, state_of)

    # The change: window 2048. Host 2's SGLang ignores the window (parses the flag, runs without).
    set_vars(sglang_speculative_draft_window_size=2048)
    set_host_vars(h2["name"], sglang_environment=SIM_ENV | {"SGLANG_SIM_FAULT": "ignore_window"})
    results = tmp_path / "results"
    run = ansible_playbook(hosts_yml, "playbooks/rollout.yml", {"rollout_results_dir": str(results)})
    after = invocations(lab_hosts, state_of)

    assert run.rc != 0, run
    stop = re.search(r"Rollout stopped at (\S+): (.*)", run.out)
    assert stop and stop.group(1) == h2["name"] and "draft_window_size" in stop.group(2), run
    (run_dir,) = list(results.iterdir())

    # Host 1: updated and verified on the new window.
    rec1 = json.loads((run_dir / f"{h1['name']}.json").read_text())
    assert rec1["status"] == "updated" and rec1["observed"]["draft_window_size"] == 2048
    assert after[h1["name"]] != before[h1["name"]]

    # Host 2: the new process disagreed, was reverted to the last-known-good unit and verified.
    rec2 = json.loads((run_dir / f"{h2['name']}.json").read_text())
    assert rec2["status"] == "failed" and "draft_window_size" in rec2["error"], rec2
    assert rec2["changed_before_failure"] and rec2["reverted"] and rec2["revert_healthy"], rec2
    assert rec2["revert_observed"]["draft_window_size"] == 1024, rec2
    assert after[h2["name"]] == rec2["revert_invocation"]
    assert after[h2["name"]] not in (before[h2["name"]], rec2["failed_invocation"])
    assert state_of(h2)["ActiveState"] == "active"
    assert "draft_window_size=1024, compact_cache=True" in config_line(sh, h2, after[h2["name"]])
    assert "draft_window_size=None" in config_line(sh, h2, rec2["failed_invocation"])  # the bad one

    # Hosts 3 and 4: never touched.
    for host in (h3, h4):
        assert after[host["name"]] == before[host["name"]]
        assert not (run_dir / f"{host['name']}.json").exists()
        assert "draft_window_size=1024" in config_line(sh, host, after[host["name"]])


def test_rollout_through_the_router_drops_no_request(clean_fleet, router_clean, fleet_inv, lab_hosts,
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
    assert play_batches(run.out, ROLLOUT_PLAY) == [[h["name"]] for h in three], run

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

    # Hand edit of host 1's unit, no restart: the unit drifted, the process not (yet).
    h1 = lab_hosts[0]
    unit_before = sh(h1, "cat /etc/systemd/system/sglang.service")
    sh(h1, "sed -i 's/\"2048\"/\"4096\"/' /etc/systemd/system/sglang.service && systemctl daemon-reload")
    run, summary = verify()
    assert run.rc != 0 and summary["drifted"] == [h1["name"]], run
    (rec,) = [r for r in summary["hosts"] if r["host"] == h1["name"]]
    assert [d["what"] for d in rec["differences"]] == ["unit file"], rec
    assert '- "4096"' in rec["differences"][0]["observed"].replace("    ", "")

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
    assert re.search(rf"Drift on {re.escape(h1['name'])};.*draft_window_size expected 2048 observed 4096",
                     " ".join(run.out.split())), run
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
        "sweep_bench": {"num_prompts": 16, "concurrency": 4, "max_new_tokens": 64},
    }
    run = ansible_playbook(hosts_yml, "gpufleet.inference.sweep", extra)
    assert run.rc == 0, run

    csv_text = (results / "results.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    combos = {(r["sglang_speculative_draft_window_size"], r["sglang_speculative_num_draft_tokens"]) for r in rows}
    assert combos == {("", "8"), ("", "16"), ("1024", "8"), ("1024", "16")}, csv_text
    for row in rows:
        assert row["status"] == "ok", row
        assert float(row["output_tokens_per_s"]) > 0 and float(row["p90_ms"]) > 0, row
        assert int(row["requests_ok"]) == 16 and int(row["requests_failed"]) == 0, row
        assert float(row["spec_accept_length_mean"]) > 1, row
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
    assert "4 measured already" in " ".join(rerun.out.split()), rerun
    assert "0 to measure" in " ".join(rerun.out.split()), rerun
    assert "Benchmark the combination" not in rerun.out, rerun
    assert state_of(host)["InvocationID"] == inv
    assert {p.name: p.read_bytes() for p in results.iterdir()} == files
    print(f"\nsweep 2x2 on {host['name']}: {run.seconds:.1f} s, re-run {rerun.seconds:.1f} s\n{md}")
