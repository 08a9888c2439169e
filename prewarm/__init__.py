"""Prewarm planning and actuation (filled in by the prewarm issue)."""
