"""Autotuning: the mode and the cache (cache.py) and the timing of variants (tuner.py)."""
