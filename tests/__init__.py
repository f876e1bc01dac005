"""The tests of amm-rules, a package so that tests and benchmarks import the shared
helpers of :mod:`tests.support` as modules (``python -m pytest`` from the repository root).
"""
