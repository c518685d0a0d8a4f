# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Results of a settings sweep: results.csv (merged by combination), results.md, results.png; and
the collection's chart style, which the canary analysis's chart shares.

Private to this collection: no compatibility promise. The CSV is the source of truth: a re-run
merges into it (a combination measured again replaces its row, the others stay), the Markdown
table and the chart are rendered from the merged CSV, and every output is deterministic so an
unchanged sweep reports ``changed=false``.
"""
from __future__ import annotations

import csv
import io
import os
import traceback

from ansible_collections.gpufleet.inference.plugins.module_utils._files import write_atomic

# matplotlib is imported only where a chart is drawn: every gpufleet filter loads the filter
# files, and a top-level import would make each of them import matplotlib on the controller.


CHART_SKIPPED = ("matplotlib cannot be imported on the controller (%s); install the collection's optional "
                 "chart extra (pip install matplotlib) for results.png")


def matplotlib_missing():
    """None when matplotlib can be imported, else the import error (a traceback)."""
    try:
        import matplotlib  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    except ImportError:
        return traceback.format_exc()
    return None


CSV_NAME = "results.csv"
MD_NAME = "results.md"
PNG_NAME = "results.png"

# The figures of gpufleet.inference.sglang_bench (bench_serving's names) a sweep keeps, in the order
# the report shows them. Any other field of a row is a setting, part of the combination key unless
# key_fields says otherwise. playbooks/tasks/sweep_combination.yml passes exactly these.
METRIC_FIELDS = (
    "output_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms", "accept_length",
    "completed", "failed_requests", "total_output_tokens", "duration",
)
IGNORED_FIELDS = ("errors", "details", "changed", "failed", "msg", "invocation", "skipped")


class ReportError(Exception):
    pass


def cell(value):
    """How a value is written in the CSV (and shown in the table)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return "; ".join(str(v) for v in value) if isinstance(value, list) else str(value)
    return str(value)


def _key_part(value):
    text = cell(value).strip()
    lowered = text.lower()
    if lowered in ("none", "null"):
        return ""
    if lowered in ("true", "false"):
        return lowered
    return text


def combination_key(row, key_fields):
    """``name=value|name=value`` over key_fields: what identifies a measured combination."""
    return "|".join("%s=%s" % (name, _key_part(row.get(name))) for name in key_fields)


def default_key_fields(rows, header=None):
    fields = []
    for name in list(header or []) + [name for row in rows for name in row]:
        if name not in METRIC_FIELDS and name not in IGNORED_FIELDS and name not in fields:
            fields.append(name)
    return fields


def read_csv(path):
    """(header, rows as dicts of strings); ([], []) when the file does not exist."""
    if not os.path.exists(path):
        return [], []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = [dict((k, v if v is not None else "") for k, v in row.items() if k is not None) for row in reader]
        return list(reader.fieldnames or []), rows


def columns_for(key_fields, rows, header=()):
    names = set(header)
    for row in rows:
        names.update(row)
    names.difference_update(IGNORED_FIELDS)
    metrics = [m for m in METRIC_FIELDS if m in names and m not in key_fields]
    others = sorted(n for n in names if n not in key_fields and n not in METRIC_FIELDS)
    return list(key_fields) + others + metrics


def merge_rows(existing, new_rows, key_fields):
    """Existing rows in their order, a re-measured combination replaced in place, new ones appended."""
    merged = [dict(row) for row in existing]
    index = dict((combination_key(row, key_fields), i) for i, row in enumerate(merged))
    for row in new_rows:
        text_row = dict((name, cell(value)) for name, value in row.items() if name not in IGNORED_FIELDS)
        key = combination_key(text_row, key_fields)
        if key in index:
            merged[index[key]] = text_row
        else:
            index[key] = len(merged)
            merged.append(text_row)
    return merged


def render_csv(columns, rows):
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(dict((name, row.get(name, "")) for name in columns))
    return out.getvalue()


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def best_index(rows, metric, higher_is_better=True):
    """Index of the best row by metric (first one on ties); None when no row has a number."""
    best = None
    for i, row in enumerate(rows):
        value = _number(row.get(metric))
        if value is None:
            continue
        if best is None or (value > best[1] if higher_is_better else value < best[1]):
            best = (i, value)
    return None if best is None else best[0]


def _md_escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(title, columns, rows, metric, best, higher_is_better=True, chart_note=None):
    lines = ["# %s" % title, ""]
    if chart_note:
        lines += ["Chart: %s" % chart_note, ""]
    direction = "highest" if higher_is_better else "lowest"
    if best is None:
        lines.append("No row has a value for `%s`, so none is marked best." % metric)
    else:
        lines.append("Best (%s `%s`): **%s**" % (direction, metric, _md_escape(rows[best].get(metric, ""))))
    lines += ["", "| best | " + " | ".join(_md_escape(c) for c in columns) + " |",
              "|---|" + "|".join("---" for dummy in columns) + "|"]
    for i, row in enumerate(rows):
        mark = "**best**" if i == best else ""
        lines.append("| %s | %s |" % (mark, " | ".join(_md_escape(row.get(c, "")) for c in columns)))
    return "\n".join(lines) + "\n"


# The collection's chart style (the sweep's bars and the canary analysis's panels): Agg, no pyplot
# state, one palette, values written on the bars, no metadata so the same data give the same bytes.
BAR_COLOR = "#1b9e77"
HIGHLIGHT_COLOR = "#d95f02"
VERDICT_COLORS = {"regression": "#d62728", "inconclusive": "#7f7f7f"}


def new_figure(width, height):
    """(figure, matplotlib.figure module) on the Agg canvas; ReportError without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("matplotlib is needed for the chart: %s" % traceback.format_exc().splitlines()[-1])
    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def annotate_bars(axes, positions, values, tops=None):
    """Each bar's value written above it (above ``tops``, e.g. its whisker, when given)."""
    for x, value, top in zip(positions, values, tops or values):
        axes.annotate("%g" % round(value, 2), (x, max(value, top)), ha="center", va="bottom", fontsize=7)


def png_bytes(figure):
    figure.tight_layout()
    out = io.BytesIO()
    # No Software/date metadata: the same rows give the same bytes.
    figure.savefig(out, format="png", metadata={"Software": None})
    return out.getvalue()


def render_png(title, rows, key_fields, metric, best):
    """A bar chart of metric per combination as PNG bytes."""
    labels = ["\n".join("%s=%s" % (name, row.get(name) or "None") for name in key_fields) or str(i + 1)
              for i, row in enumerate(rows)]
    values = [_number(row.get(metric)) or 0.0 for row in rows]
    figure = new_figure(max(6.0, 0.9 * len(rows) + 2.0), 4.8)
    axes = figure.add_subplot(1, 1, 1)
    colors = [HIGHLIGHT_COLOR if i == best else BAR_COLOR for i in range(len(rows))]
    positions = list(range(len(rows)))
    axes.bar(positions, values, color=colors)
    axes.set_xticks(positions)
    axes.set_xticklabels(labels, fontsize=7)
    axes.set_ylabel(metric)
    axes.set_title(title)
    annotate_bars(axes, positions, values)
    return png_bytes(figure)


def _read_bytes(path):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        return handle.read()


def _write_atomic(path, data):
    write_atomic(path, data, 0o644)


def query(results_dir, candidates=None, key_fields=None):
    """What is measured already: keys, rows, and the candidates not measured yet."""
    header, rows = read_csv(os.path.join(results_dir, CSV_NAME))
    candidates = candidates or []
    key_fields = list(key_fields or default_key_fields(candidates, header))
    measured = [combination_key(row, key_fields) for row in rows]
    measured_set = set(measured)
    pending = [c for c in candidates if combination_key(c, key_fields) not in measured_set]
    pending_keys = [combination_key(c, key_fields) for c in pending]
    plan = "%d combination(s), %d to measure (%s): %s" % (len(candidates), len(pending),
                                                          os.path.join(results_dir, CSV_NAME), pending_keys)
    return {"measured_keys": measured, "rows": rows, "pending": pending, "pending_keys": pending_keys,
            "key_fields": key_fields, "msg": plan}


def write_report(results_dir, new_rows, key_fields=None, metric="output_throughput", higher_is_better=True,
                 title="SGLang settings sweep", chart=True, check_mode=False, chart_skipped=None):
    """Merge new_rows into results.csv and re-render results.md (and results.png).

    chart_skipped: why the chart is not drawn although asked for (matplotlib missing); results.md says so."""
    csv_path = os.path.join(results_dir, CSV_NAME)
    header, existing = read_csv(csv_path)
    key_fields = list(key_fields or default_key_fields(new_rows, header))
    if not key_fields:
        raise ReportError("no setting fields to identify a combination: give key_fields or rows with settings")
    rows = merge_rows(existing, new_rows, key_fields)
    columns = columns_for(key_fields, rows, header)
    best = best_index(rows, metric, higher_is_better)
    outputs = {
        csv_path: render_csv(columns, rows).encode("utf-8"),
        os.path.join(results_dir, MD_NAME): render_markdown(title, columns, rows, metric, best, higher_is_better,
                                                            "skipped: %s" % chart_skipped if chart_skipped
                                                            else None).encode("utf-8"),
    }
    if chart and not chart_skipped:
        outputs[os.path.join(results_dir, PNG_NAME)] = render_png(title, rows, key_fields, metric, best)
    before_csv = _read_bytes(csv_path)
    written = [path for path, data in sorted(outputs.items()) if _read_bytes(path) != data]
    if written and not check_mode:
        if not os.path.isdir(results_dir):
            os.makedirs(results_dir)
        for path in written:
            _write_atomic(path, outputs[path])
    return {
        "changed": bool(written),
        "written": written,
        "rows": rows,
        "columns": columns,
        "key_fields": key_fields,
        "best": rows[best] if best is not None else None,
        "measured_keys": [combination_key(row, key_fields) for row in rows],
        "csv_path": csv_path,
        "md_path": os.path.join(results_dir, MD_NAME),
        "png_path": os.path.join(results_dir, PNG_NAME) if chart and not chart_skipped else None,
        "chart_skipped": chart_skipped,
        "diff": {"before": (before_csv or b"").decode("utf-8"), "after": outputs[csv_path].decode("utf-8"),
                 "before_header": csv_path, "after_header": csv_path},
    }
