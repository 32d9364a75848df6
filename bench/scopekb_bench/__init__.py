"""scopekb's benchmark suite: every figure is a ratio against a baseline measured in the same run.

Entry point: ``bench/run [--quick]`` (see :mod:`scopekb_bench.main`). Results, the Markdown report and its plots
are written under ``bench/results/``.
"""
