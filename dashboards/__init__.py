"""Plotly figures and the HTML report of a study, reading only through ``db``."""
