"""Per-rank communication/compute timelines (capture, analysis, trace export).

Usable on its own around any training loop; never imports ``autotune``.
"""
