# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_report: CSV merge and resume, Markdown best marking, the PNG chart, determinism and check mode."""
import csv

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _report
from ansible_collections.gpufleet.inference.plugins.module_utils._report import (
    best_index,
    combination_key,
    default_key_fields,
    query,
    write_report,
)

KEYS = ["draft_window_size", "block_size"]


def row(window, block, tps, p99=100.0, **extra):
    data = {"draft_window_size": window, "block_size": block, "output_throughput": tps, "p99_e2e_latency_ms": p99,
            "errors": []}
    data.update(extra)
    return data


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_write_creates_csv_md_png(tmp_path):
    out = tmp_path / "results"
    result = write_report(str(out), [row(2048, 16, 700.5), row(None, 16, 650.0)], KEYS)
    assert result["changed"] is True
    assert sorted(p.name for p in out.iterdir()) == ["results.csv", "results.md", "results.png"]
    assert (out / "results.csv").read_text().splitlines() == [
        "draft_window_size,block_size,output_throughput,p99_e2e_latency_ms", "2048,16,700.5,100.0", ",16,650.0,100.0"]
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["best"]["draft_window_size"] == "2048"
    assert "errors" not in result["columns"]


def test_markdown_marks_the_best_row(tmp_path):
    write_report(str(tmp_path), [row(1024, 16, 500.0), row(2048, 16, 900.0), row(4096, 16, 800.0)], KEYS)
    md = (tmp_path / "results.md").read_text().splitlines()
    assert md[0] == "# SGLang settings sweep"
    assert "Best (highest `output_throughput`): **900.0**" in md
    assert "| **best** | 2048 | 16 | 900.0 | 100.0 |" in md
    assert sum(line.count("**best**") for line in md if line.startswith("|")) == 1


def test_lower_is_better_metric(tmp_path):
    result = write_report(str(tmp_path), [row(1024, 16, 500.0, p99=80.0), row(2048, 16, 900.0, p99=120.0)], KEYS,
                          metric="p99_e2e_latency_ms", higher_is_better=False)
    assert result["best"]["draft_window_size"] == "1024"
    assert "lowest `p99_e2e_latency_ms`" in (tmp_path / "results.md").read_text()


def test_rerun_merges_keeps_other_rows_and_replaces_the_remeasured(tmp_path):
    write_report(str(tmp_path), [row(1024, 16, 500.0), row(2048, 16, 900.0)], KEYS)
    result = write_report(str(tmp_path), [row("2048", "16", 950.0), row(4096, 16, 100.0)], KEYS)
    rows = read_rows(tmp_path / "results.csv")
    assert [(r["draft_window_size"], r["output_throughput"]) for r in rows] == [
        ("1024", "500.0"), ("2048", "950.0"), ("4096", "100.0")]
    assert result["measured_keys"] == ["draft_window_size=1024|block_size=16", "draft_window_size=2048|block_size=16",
                                       "draft_window_size=4096|block_size=16"]


def test_same_rows_again_change_nothing(tmp_path):
    rows = [row(1024, 16, 500.0), row(2048, 16, 900.0)]
    write_report(str(tmp_path), rows, KEYS)
    before = dict((p.name, p.read_bytes()) for p in tmp_path.iterdir())
    result = write_report(str(tmp_path), rows, KEYS)
    assert result["changed"] is False and result["written"] == []
    assert dict((p.name, p.read_bytes()) for p in tmp_path.iterdir()) == before


def test_new_columns_extend_the_csv(tmp_path):
    write_report(str(tmp_path), [row(1024, 16, 500.0)], KEYS)
    write_report(str(tmp_path), [row(2048, 16, 900.0, accept_length=3.2)], KEYS)
    rows = read_rows(tmp_path / "results.csv")
    assert rows[0]["accept_length"] == "" and rows[1]["accept_length"] == "3.2"


def test_check_mode_writes_nothing(tmp_path):
    out = tmp_path / "results"
    result = write_report(str(out), [row(1024, 16, 500.0)], KEYS, check_mode=True)
    assert result["changed"] is True and len(result["written"]) == 3
    assert not out.exists()


def test_query_tells_pending_combinations(tmp_path):
    write_report(str(tmp_path), [row(2048, 16, 900.0), row(None, 16, 800.0)], KEYS)
    candidates = [{"draft_window_size": "2048", "block_size": 16}, {"draft_window_size": "None", "block_size": "16"},
                  {"draft_window_size": 4096, "block_size": 16}]
    result = query(str(tmp_path), candidates, KEYS)
    assert result["measured_keys"] == ["draft_window_size=2048|block_size=16", "draft_window_size=|block_size=16"]
    assert result["pending"] == [{"draft_window_size": 4096, "block_size": 16}]
    assert result["pending_keys"] == ["draft_window_size=4096|block_size=16"]
    assert result["msg"] == "3 combination(s), 1 to measure (%s/results.csv): ['draft_window_size=4096|block_size=16']" % (
        tmp_path,)


def test_query_without_results_has_everything_pending(tmp_path):
    result = query(str(tmp_path / "none"), [{"a": 1}], None)
    assert result["measured_keys"] == [] and result["pending"] == [{"a": 1}] and result["key_fields"] == ["a"]


def test_default_key_fields_are_the_settings():
    assert default_key_fields([row(1, 2, 3.0), {"tree_budget": 8}]) == ["draft_window_size", "block_size", "tree_budget"]


def test_combination_key_normalizes_booleans_and_none():
    assert combination_key({"a": True, "b": None}, ["a", "b"]) == combination_key({"a": "True", "b": "null"}, ["a", "b"])


def test_best_index_ignores_rows_without_a_number_and_keeps_the_first_on_ties():
    rows = [{"m": ""}, {"m": "5"}, {"m": "x"}, {"m": "5.0"}]
    assert best_index(rows, "m") == 1
    assert best_index([{"m": ""}], "m") is None


def test_no_key_fields_is_an_error(tmp_path):
    with pytest.raises(_report.ReportError, match="key_fields"):
        write_report(str(tmp_path), [{"output_throughput": 1.0}])


def test_chart_off_writes_no_png(tmp_path):
    result = write_report(str(tmp_path), [row(1, 2, 3.0)], KEYS, chart=False)
    assert result["png_path"] is None and not (tmp_path / "results.png").exists()


def test_the_sweep_passes_exactly_the_figures_the_report_keeps():
    import os
    import yaml
    from ansible_collections.gpufleet.inference.plugins.module_utils._bench import FIGURES
    path = os.path.join(os.path.dirname(_report.__file__), "..", "..", "playbooks", "tasks", "sweep_combination.yml")
    with open(path) as handle:
        tasks = yaml.safe_load(handle)
    block = next(task for task in tasks if "block" in task)
    assert tuple(block["vars"]["sweep_figures"]) == _report.METRIC_FIELDS
    assert set(_report.METRIC_FIELDS) <= set(FIGURES)  # every kept figure is one sglang_bench returns
