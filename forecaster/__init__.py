"""Per-function invocation history and forecasts (filled in by the forecaster issue)."""
