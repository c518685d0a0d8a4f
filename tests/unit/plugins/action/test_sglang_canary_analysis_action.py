# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_canary_analysis's action plugin: arguments checked before any request, the analysis's result as
the task's, the report written (not in check mode), keys kept out, and its documentation in step with
its argument spec."""
import json

import pytest
import yaml
from ansible.errors import AnsibleActionFail

import fakes
from ansible_collections.gpufleet.inference.plugins.action import sglang_canary_analysis as action_mod
from ansible_collections.gpufleet.inference.plugins.module_utils import _canary
from ansible_collections.gpufleet.inference.plugins.modules import sglang_canary_analysis as docs

KEY = "sk-do-not-print"
ARGS = {"canary": {"name": "gpu-1", "url": "http://10.0.0.1:30000", "api_key": KEY},
        "baseline": {"name": "gpu-2", "url": "http://10.0.0.2:30000"}}
OUTCOME = {"verdict": "regression", "message": "regression: TPOT p50 +31.0% past the threshold +5.0%",
           "metrics": [], "critical": [], "advice": []}


@pytest.fixture
def ran(monkeypatch):
    seen = {}

    def run(self):
        seen["analysis"] = self
        return dict(OUTCOME)

    def write_report(result, report_dir, chart=True, check_mode=False):
        seen["report"] = (report_dir, chart, check_mode)
        return {"json": report_dir + "/canary-analysis.json"}
    monkeypatch.setattr(_canary.Analysis, "run", run)
    monkeypatch.setattr(action_mod, "write_report", write_report)
    return seen


def test_the_result_is_the_analysis_verdict_and_the_task_does_not_fail_on_it(ran):
    result = fakes.make_action(action_mod, dict(ARGS, rounds=4, workload={"num_prompts": 16})).run(task_vars={})
    assert result["verdict"] == "regression" and result["msg"] == OUTCOME["message"]
    assert result["changed"] is False and not result.get("failed")
    analysis = ran["analysis"]
    assert analysis.rounds == 4 and analysis.workload["num_prompts"] == 16
    assert analysis.targets["canary"].api_key == KEY and "report" not in ran and "report" not in result


def test_the_report_goes_to_report_dir_and_not_in_check_mode(ran, tmp_path):
    result = fakes.make_action(action_mod, dict(ARGS, report_dir=str(tmp_path), chart=False)).run(task_vars={})
    assert ran["report"] == (str(tmp_path), False, False) and result["report"]["json"].endswith("canary-analysis.json")
    fakes.make_action(action_mod, dict(ARGS, report_dir=str(tmp_path)), check_mode=True).run(task_vars={})
    assert ran["report"] == (str(tmp_path), True, True)


@pytest.mark.parametrize("args,message", [
    ({"canary": {"name": "x"}, "baseline": ARGS["baseline"]}, "url"),
    ({"canary": ARGS["canary"]}, "baseline"),
    (dict(ARGS, rounds="many"), "rounds"),
])
def test_arguments_the_spec_refuses_fail_before_any_request(monkeypatch, args, message):
    monkeypatch.setattr(_canary.Analysis, "run", lambda self: pytest.fail("the analysis ran"))
    with pytest.raises(AnsibleActionFail, match=message):
        fakes.make_action(action_mod, args).run(task_vars={})


def test_inputs_the_analysis_refuses_fail_with_its_words(monkeypatch):
    monkeypatch.setattr(_canary.Analysis, "run", lambda self: pytest.fail("the analysis ran"))
    with pytest.raises(AnsibleActionFail) as failed:
        fakes.make_action(action_mod, dict(ARGS, thresholds={"max_latency": 0.1})).run(task_vars={})
    assert str(failed.value).startswith("sglang_canary_analysis: unknown threshold(s) max_latency")
    assert KEY not in str(failed.value)


def test_the_keys_are_no_log():
    assert action_mod.TARGET["api_key"]["no_log"] is True and action_mod.ARGUMENT_SPEC["router_api_key"]["no_log"]


def _documented(options):
    out = {}
    for name, doc in options.items():
        entry = {"type": doc.get("type", "str"), "default": doc.get("default"), "required": doc.get("required", False)}
        if doc.get("suboptions"):
            entry["suboptions"] = _documented(doc["suboptions"])
        out[name] = entry
    return out


def _specified(spec):
    out = {}
    for name, option in spec.items():
        entry = {"type": option.get("type", "str"), "default": option.get("default"),
                 "required": option.get("required", False)}
        if option.get("options"):
            entry["suboptions"] = _specified(option["options"])
        out[name] = entry
    return out


def test_the_documentation_matches_the_argument_spec():
    documented = _documented(yaml.safe_load(docs.DOCUMENTATION)["options"])
    assert documented == _specified(action_mod.ARGUMENT_SPEC)
    returned = yaml.safe_load(docs.RETURN)
    assert {"verdict", "message", "metrics", "canary", "baseline", "traffic", "report"} <= set(returned)
    assert json.dumps(yaml.safe_load(docs.EXAMPLES))  # the examples are YAML
