"""Tables, figures and a report (Markdown + self-contained HTML) from finished run folders.

``build_report(["runs/"], "report/")`` loads every run under the folders given (each holds
``summary.json`` and ``metrics.jsonl``) and writes ``report.md``, ``report.html``, ``tables/*.csv|md``
(the quality table, the paper's Tables III–V with the published numbers beside ours) and
``figures/*.png`` (the paper's Figures 4/5 and 6, and Table III as a chart).

``report.fedpc.build_fedpc_report`` does the same for FedPC's paper (``reproduce --paper fedpc``): its
Tables 2–4 and Figure 6 beside the numbers of ``paper_fedpc.py``.
"""

from .builder import ReportFiles, build_report, build_report_for, differences
from .runs import ReportError, RunResult, find_run_dirs, load_run, load_runs

__all__ = [
    "ReportFiles",
    "ReportError",
    "RunResult",
    "build_report",
    "build_report_for",
    "differences",
    "find_run_dirs",
    "load_run",
    "load_runs",
]
