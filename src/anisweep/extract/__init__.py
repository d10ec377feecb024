"""The one place a model runs forward: one pass per checkpoint with streaming reductions in hooks, written
as Parquet tables (extract.run); everything downstream reads those tables.
"""
