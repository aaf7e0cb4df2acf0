"""What a study exports: ``best_config.json`` and DeepSpeed's ``ds_config.json``
(``best_config``, ``ds_config``), the trainers' configs (``trainers``: Accelerate, torchtitan),
Megatron-LM's arguments (``megatron``), all written atomically (``files``).

May import: ``autotune.study``, ``model``, the vocabulary and ``db``; never ``autotune.search``,
``trial`` or ``cli``."""
