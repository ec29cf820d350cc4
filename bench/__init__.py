"""sandlot's benchmark suite: each figure measured beside its same-run baseline.

Run ``python -m bench [NAME ...] [--quick]`` from the repository root; see ``bench/README.md``.
"""
