"""Several training jobs on one fabric: the spec file, the run, per-job results and multi-job replay.

The modules sit in different layers (docs/architecture.md): `spec` with the workloads, `results` with the
results, `run` with the launcher, `replay` with the analysis.
"""
