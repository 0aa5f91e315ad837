"""Kernel Definitions shipped with fi-profile (JSON data, read through profiler.catalog)."""
