# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sweep_report through main(): present, query, check mode with diff, a controller without matplotlib."""
import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.modules import sweep_report


class Done(Exception):
    pass


@pytest.fixture
def module_exits(monkeypatch):
    def finish(self, **kwargs):
        raise Done(kwargs)
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", finish)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", lambda self, **kw: finish(self, failed=True, **kw))


def call(args):
    with patch_module_args(args):
        with pytest.raises(Done) as done:
            sweep_report.main()
    return done.value.args[0]


ROWS = [{"window": 2048, "output_throughput": 900.0}, {"window": 4096, "output_throughput": 800.0}]


def test_present_then_query_then_idempotent(tmp_path, module_exits):
    first = call({"results_dir": str(tmp_path), "rows": ROWS})
    assert first["changed"] is True and first["best"] == {"window": "2048", "output_throughput": "900.0"}
    assert "diff" not in first
    state = call({"results_dir": str(tmp_path), "state": "query", "rows": [{"window": 2048}, {"window": 1024}]})
    assert state["changed"] is False and state["pending"] == [{"window": 1024}]
    again = call({"results_dir": str(tmp_path), "rows": ROWS[:1]})
    assert again["changed"] is False


def test_check_mode_with_diff(tmp_path, module_exits):
    result = call({"results_dir": str(tmp_path / "r"), "rows": ROWS, "_ansible_check_mode": True, "_ansible_diff": True})
    assert result["changed"] is True and not (tmp_path / "r").exists()
    assert result["diff"]["before"] == "" and result["diff"]["after"].startswith("window,output_throughput\n")


def test_without_matplotlib_the_results_are_written_and_say_the_chart_was_skipped(
        tmp_path, module_exits, monkeypatch):
    monkeypatch.setattr(sweep_report, "matplotlib_missing",
                        lambda: "Traceback ...\nModuleNotFoundError: No module named 'matplotlib'\n")
    warned = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: warned.append(text))
    result = call({"results_dir": str(tmp_path), "rows": ROWS})
    assert "failed" not in result and result["changed"] is True
    assert result["png_path"] is None and not (tmp_path / "results.png").exists()
    assert "No module named 'matplotlib'" in result["chart_skipped"] and "pip install matplotlib" in result["chart_skipped"]
    assert len(warned) == 1 and "chart skipped" in warned[0], warned
    assert (tmp_path / "results.csv").read_text().startswith("window,output_throughput\n")
    report = (tmp_path / "results.md").read_text()
    assert "Chart: skipped: matplotlib cannot be imported on the controller (ModuleNotFoundError: No module named " \
           "'matplotlib')" in report, report
    assert "| **best** | 2048 | 900.0 |" in report, report


def test_with_chart_false_nothing_is_said_about_a_chart(tmp_path, module_exits, monkeypatch):
    monkeypatch.setattr(sweep_report, "matplotlib_missing", lambda: "ModuleNotFoundError: No module named 'matplotlib'")
    result = call({"results_dir": str(tmp_path), "rows": ROWS, "chart": False})
    assert result["changed"] is True and result["png_path"] is None and result["chart_skipped"] is None
    assert "Chart" not in (tmp_path / "results.md").read_text()
