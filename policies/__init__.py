"""Placement policies: the cluster as a policy sees it, the shared filter, and the scorers.

Everything here is pure: plain data in (`PodRequest`, `NodeTable`), plain data out (numpy
arrays, verdicts). No HTTP, no Kubernetes client, no clock reads.
"""
