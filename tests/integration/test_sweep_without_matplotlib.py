"""A sweep on a controller without matplotlib (an EE built without the chart extra): the results are
written, the report says the chart was skipped and why, and the host is restored - also when a step
after the first combination fails (the restore runs from the sweep's `always`).

matplotlib is made unimportable for the controller's modules by a package of that name on PYTHONPATH
whose import raises ImportError, as Python's own would: the controller's Python is otherwise unchanged.
Lean: one host, two combinations, a short benchmark, no router.
"""
from __future__ import annotations

import csv
import io

import pytest
from lab_support import ansible_playbook
from rollout_support import config_line
from rollout_support import fleet_inv  # noqa: F401 pylint: disable=unused-import

ORIGINAL_LINE = "block_size=16, draft_window_size=2048, compact_cache=True"
MATRIX = {"sglang_speculative_draft_window_size": [1024, 4096]}
BENCH = {"num_prompts": 4, "concurrency": 2, "max_new_tokens": 16}


@pytest.fixture
def no_matplotlib(tmp_path):
    """An environment in which `import matplotlib` fails on the controller."""
    shadow = tmp_path / "no-matplotlib"
    (shadow / "matplotlib").mkdir(parents=True)
    (shadow / "matplotlib" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    return {"PYTHONPATH": str(shadow)}


def restored(sh, state_of, host) -> str:
    return config_line(sh, host, state_of(host)["InvocationID"])


def sweep(hosts_yml, results, env, **extra):
    return ansible_playbook(hosts_yml, "gpufleet.inference.sweep", {
        "sweep_results_dir": str(results), "sweep_matrix": MATRIX, "sweep_bench": BENCH, **extra}, env=env)


def test_the_sweep_writes_its_results_says_the_chart_was_skipped_and_restores_the_host(
        clean_fleet, fleet_inv, lab_hosts, state_of, sh, tmp_path, no_matplotlib):  # noqa: F811
    hosts_yml, set_vars, _host_vars, _deploy = fleet_inv
    set_vars()  # the host's own settings: window 2048, 16 draft tokens
    host = lab_hosts[0]
    results = tmp_path / "sweep"
    run = sweep(hosts_yml, results, no_matplotlib)
    assert run.rc == 0, run
    rows = list(csv.DictReader(io.StringIO((results / "results.csv").read_text())))
    assert sorted(r["sglang_speculative_draft_window_size"] for r in rows) == ["1024", "4096"], rows
    assert all(r["status"] == "ok" and float(r["output_throughput"]) > 0 for r in rows), rows
    report = (results / "results.md").read_text()
    assert "Chart: skipped: matplotlib cannot be imported on the controller (ModuleNotFoundError: No module " \
           "named 'matplotlib')" in report, report
    assert not (results / "results.png").exists()
    assert "chart: skipped: matplotlib cannot be imported" in " ".join(run.out.split()), run
    assert ORIGINAL_LINE in restored(sh, state_of, host)


def test_a_failure_after_a_combination_still_restores_the_host(
        clean_fleet, fleet_inv, lab_hosts, state_of, sh, tmp_path, no_matplotlib):  # noqa: F811
    """The final report fails (its results directory is a file the module cannot write into), after the
    host ran the swept settings: the restore runs all the same, and the play fails."""
    hosts_yml, set_vars, _host_vars, _deploy = fleet_inv
    set_vars()
    host = lab_hosts[0]
    results = tmp_path / "sweep"
    run = sweep(hosts_yml, results, no_matplotlib,
                sweep_matrix={"sglang_speculative_draft_window_size": [1024]})
    assert run.rc == 0, run
    (results / "results.md").unlink()
    (results / "results.md").mkdir()  # the report cannot be written now; the CSV still says 1024 was measured
    swept = {"sglang_speculative_draft_window_size": [1024, 4096]}
    failed = sweep(hosts_yml, results, no_matplotlib, sweep_matrix=swept)
    assert failed.rc != 0, failed
    assert "Restore the host (runs whatever failed before it)" in failed.out, failed
    assert "block_size=16, draft_window_size=4096" not in restored(sh, state_of, host)
    assert ORIGINAL_LINE in restored(sh, state_of, host), failed
