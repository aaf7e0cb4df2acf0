"""What runs a trial: the Ray executor and pool on the driver (``executor``, ``pool``,
``placement``), the rank's training loop on the worker (``runner``), the models it builds
(``models/``) and the parallelisms it applies (``parallel/``), and the result that crosses the Ray
boundary (``result``, which imports neither torch nor ray).

May import: the vocabulary (``autotune.config``, ``errors``, ``status``, ``shapes``, ``hf_config``,
``layouts``, ``hardware``), ``profiler`` and ``db``; never ``autotune.model``, ``study``,
``search``,
``export`` or ``cli``."""
