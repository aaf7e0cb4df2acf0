"""Arithmetic only: the memory model (``memory``), the step-time model (``perf_model``) on a
described cluster (``cluster``), their calibration from measurements (``calibration``,
``span_fit``) and the statistics of noisy measurements (``noise``).

No module here imports torch or ray at module level. May import: the vocabulary
(``autotune.config``, ``errors``, ``status``, ``shapes``, ``hf_config``, ``layouts``, ``hardware``),
``profiler`` and ``db``; never ``autotune.trial``, ``study``, ``search``, ``export`` or ``cli``."""
