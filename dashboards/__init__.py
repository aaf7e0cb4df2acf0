"""Plotly figures and the HTML report of a study, reading only through ``db``.

``data`` loads a study into frozen plain data (leaderboard order from
``autotune.study.leaderboard``),
``figures`` draws one Plotly figure per view, ``report`` writes them into one self-contained
HTML file, and ``serve`` serves that report on localhost, rebuilt on each request.
"""

from dashboards.data import StudyData, load_study
from dashboards.report import build_report, write_report

__all__ = ["StudyData", "build_report", "load_study", "write_report"]
