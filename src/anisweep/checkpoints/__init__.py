"""Which checkpoints exist and how to get them: the catalogue of families (Hub suites, local runs, toys),
their step grids, the fetch of one checkpoint's weights, and the preflight that runs before any weights move.
"""
