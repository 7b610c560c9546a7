"""Benchmarks of milegpo, grouped by what they measure; run from the repository's root as
``python -m benchmarks.<group>.<script>`` (see ``benchmarks/README.md``)."""
