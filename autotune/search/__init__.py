"""The search: its front (``search``: ``SearchSpec``, ``Search``), its loop (``loop``), the space
of knobs (``space``), the memory screen (``screen``), the strategies that propose trials
(``strategies/``), the study's calibration (``study_calibration``) and the replay of measured
tables (``replay``, a benchmark tool the search never imports).

May import: ``autotune.study``, ``trial``, ``model``, the vocabulary, ``profiler`` and ``db``;
never ``autotune.export`` or ``cli``."""
