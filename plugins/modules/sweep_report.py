#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sweep_report
short_description: Merge settings-sweep results into results.csv, results.md and a results.png chart
version_added: 0.1.0
description:
  - Keeps the results of a settings sweep in O(results_dir) on the controller.
  - With O(state=present), merges O(rows) into C(results.csv), one row per combination of the settings in
    O(key_fields). A combination measured again replaces its row; rows of other combinations are kept, so a
    resumed or repeated sweep never loses earlier measurements.
  - Renders C(results.md) (a Markdown table with the best row marked by O(metric)) and C(results.png)
    (a bar chart of O(metric) per combination, best bar highlighted) from the merged CSV.
  - The chart is optional. Without matplotlib on the controller, C(results.csv) and C(results.md) are written all
    the same, C(results.md) says that the chart was skipped and why, the module warns and returns
    RV(chart_skipped).
  - With O(state=query), only reads C(results.csv) and tells which combinations are measured already and which
    of the candidate O(rows) are still pending, so a sweep can resume where it stopped.
  - Outputs are deterministic; a run that changes no file reports C(changed=false).
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Computes the merged files and reports whether they would change, without writing.
  diff_mode:
    support: full
    details:
      - The text of C(results.csv) before and after.
  platform:
    platforms: posix
requirements:
  - matplotlib (optional, for the chart; without it the chart is skipped, see RV(chart_skipped))
options:
  results_dir:
    description:
      - Directory of C(results.csv), C(results.md) and C(results.png). Created when missing.
    type: path
    required: true
  state:
    description:
      - V(present) merges O(rows) and writes the files.
      - V(query) reads C(results.csv) only; O(rows) are then the candidate combinations to check.
    type: str
    choices: [present, query]
    default: present
  rows:
    description:
      - With O(state=present), result rows, each the settings of one combination plus the figures of
        M(gpufleet.inference.sglang_bench) (for example C(output_throughput), C(median_tpot_ms), C(accept_length)).
      - With O(state=query), candidate combinations (settings only).
      - The fields C(errors), C(changed), C(failed), C(msg), C(invocation) and C(skipped) are dropped.
    type: list
    elements: dict
    default: []
  key_fields:
    description:
      - The fields that identify a combination, in the order of the table's first columns.
      - Defaults to every field that is not a benchmark figure, in the order first seen (existing CSV header first).
    type: list
    elements: str
  metric:
    description:
      - The column that decides the best row and is charted.
    type: str
    default: output_throughput
  higher_is_better:
    description:
      - Whether a higher O(metric) is better; set to V(false) for latencies.
    type: bool
    default: true
  title:
    description:
      - Title of the Markdown report and the chart.
    type: str
    default: SGLang settings sweep
  chart:
    description:
      - Whether to render C(results.png). Needs matplotlib on the controller; without it the chart is skipped
        (RV(chart_skipped)) and everything else is written.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Which combinations still need a benchmark
  gpufleet.inference.sweep_report:
    results_dir: "{{ playbook_dir }}/../results/{{ inventory_hostname }}"
    state: query
    key_fields: [draft_window_size, block_size]
    rows: "{{ sweep_matrix }}"
  delegate_to: localhost
  register: sweep_state

- name: Record one measured combination
  gpufleet.inference.sweep_report:
    results_dir: "{{ playbook_dir }}/../results/{{ inventory_hostname }}"
    key_fields: [draft_window_size, block_size]
    rows:
      - draft_window_size: "{{ item.draft_window_size }}"
        block_size: "{{ item.block_size }}"
        output_throughput: "{{ bench.output_throughput }}"
        median_tpot_ms: "{{ bench.median_tpot_ms }}"
        accept_length: "{{ bench.accept_length }}"
  delegate_to: localhost
"""

RETURN = r"""
measured_keys:
  description: Keys (C(name=value|name=value) over RV(key_fields)) of the combinations in C(results.csv), in file order.
  returned: always
  type: list
  elements: str
  sample: ["draft_window_size=2048|block_size=16"]
pending:
  description: The candidate O(rows) whose combination is not in C(results.csv).
  returned: when O(state=query)
  type: list
  elements: dict
  sample: [{"draft_window_size": 4096, "block_size": 16}]
pending_keys:
  description: Keys of RV(pending).
  returned: when O(state=query)
  type: list
  elements: str
  sample: ["draft_window_size=4096|block_size=16"]
msg:
  description: The plan in one line - candidates, how many are still to measure, where, which.
  returned: when O(state=query)
  type: str
  sample: "4 combination(s), 1 to measure (/srv/sweep/results.csv): ['draft_window_size=4096|block_size=16']"
rows:
  description: The rows of C(results.csv) (after the merge with O(state=present)), values as written.
  returned: always
  type: list
  elements: dict
  sample: [{"draft_window_size": "2048", "block_size": "16", "output_throughput": "2621.4"}]
key_fields:
  description: The fields used as the combination key.
  returned: always
  type: list
  elements: str
  sample: [draft_window_size, block_size]
best:
  description: The best row by O(metric); null when no row has a number for it.
  returned: when O(state=present)
  type: dict
  sample: {"draft_window_size": "2048", "block_size": "16", "output_throughput": "2621.4"}
columns:
  description: Columns of C(results.csv).
  returned: when O(state=present)
  type: list
  elements: str
  sample: [draft_window_size, block_size, output_throughput]
written:
  description: Files written (or that would be written in check mode).
  returned: when O(state=present)
  type: list
  elements: str
  sample: [/srv/results/results.csv, /srv/results/results.md, /srv/results/results.png]
csv_path:
  description: Path of C(results.csv).
  returned: when O(state=present)
  type: str
  sample: /srv/results/results.csv
md_path:
  description: Path of C(results.md).
  returned: when O(state=present)
  type: str
  sample: /srv/results/results.md
png_path:
  description: Path of C(results.png); null when O(chart=false) or the chart was skipped.
  returned: when O(state=present)
  type: str
  sample: /srv/results/results.png
chart_skipped:
  description: Why the chart was not drawn although O(chart=true) (matplotlib missing); null when it was drawn or not asked for.
  returned: when O(state=present)
  type: str
  sample: "matplotlib cannot be imported on the controller (No module named 'matplotlib'); install the collection's
    optional chart extra (pip install matplotlib) for results.png"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils._report import (
    CHART_SKIPPED,
    ReportError,
    matplotlib_missing,
    query,
    write_report,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            results_dir=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["present", "query"]),
            rows=dict(type="list", elements="dict", default=[]),
            key_fields=dict(type="list", elements="str", no_log=False),
            metric=dict(type="str", default="output_throughput"),
            higher_is_better=dict(type="bool", default=True),
            title=dict(type="str", default="SGLang settings sweep"),
            chart=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["state"] == "query":
        module.exit_json(changed=False, **query(params["results_dir"], params["rows"], params["key_fields"]))
    # The chart is the optional part: without matplotlib the results are written and say so.
    missing = matplotlib_missing() if params["chart"] else None
    skipped = CHART_SKIPPED % missing.strip().splitlines()[-1] if missing else None
    if skipped:
        module.warn("sweep_report: chart skipped: " + skipped)
    try:
        result = write_report(params["results_dir"], params["rows"], params["key_fields"], params["metric"],
                              params["higher_is_better"], params["title"], params["chart"], module.check_mode,
                              chart_skipped=skipped)
    except (ReportError, OSError) as exc:
        module.fail_json(msg="writing the sweep report in %s: %s" % (params["results_dir"], exc))
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
