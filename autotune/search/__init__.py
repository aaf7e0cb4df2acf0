"""The search: its front (``search``: ``SearchSpec``, ``Search``), its loop (``loop``) and the
loop's phases (``conclude``: one place a trial's outcome is set; ``schedule``: trials in
flight; ``remeasure``), the space of knobs (``space``), the memory screen (``screen``), the
strategies that propose trials behind one interface (``strategies/``) and the study's
calibration (``study_calibration``). Replays over measured tables are this loop with a table
for an executor, in ``bench/replay_table.py``.

May import: ``autotune.study``, ``trial``, ``model``, the vocabulary, ``profiler`` and ``db``;
never ``autotune.export`` or ``cli``."""
