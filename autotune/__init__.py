"""autotune: find the fastest distributed-training configuration that fits, by measuring."""

__version__ = "0.1.0"
