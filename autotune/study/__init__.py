"""A study's trials in the database: writing them (``store``) and ranking them with their noise
(``leaderboard``). The search writes through it; the dashboard and the exports read the same
ranking.

May import: ``autotune.trial.result`` (the records it stores), ``autotune.model``, the vocabulary,
``profiler`` and ``db``; never ``autotune.search``, ``export`` or ``cli``."""
