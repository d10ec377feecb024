"""Parquet in, numbers out: one checkpoint's metrics from its extract tables, the spectra, the sweep that
joins the checkpoints of a model, and the partial sweep a failed run leaves. No model runs here.
"""
