"""The ranking ``autotune rank`` prints: every valid layout of a model on a cluster, screened
by memory, scored by predicted step time, folded where the models cannot tell layouts apart,
and a reference layout placed among them. Nothing runs and nothing imports torch.

- ``space``: the layouts (the search's grid with the newer knobs, walked as a tree and
  screened by memory bounds before each layout is built; the unscreened grid);
- ``score``: each layout's exact peak and, for those predicted to fit, its step time, fastest
  first; ``rank_screened`` is the whole path the command runs;
- ``collapse``: layouts that differ only in bucket size and are predicted alike, one row;
- ``compare``: a reference layout (``--compare``) against the top pick;
- ``scored``: the results (``ScoredLayout``, ``Ranking``).

The command line (``cli/rank.py``) parses flags into these calls and prints their results.
"""
