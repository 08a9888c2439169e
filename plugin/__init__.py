"""The kdrl service: the composition root (HTTP, Kubernetes adapters, OpenTelemetry, CLI).

Nothing imports `plugin`; it imports everything else and wires it together.
"""
