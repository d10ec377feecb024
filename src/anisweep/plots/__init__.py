"""Figures, from Parquet tables only: the shared kit, the per-model sweep figures, the family comparisons,
spectra, distributions, the untrained block and the gradient analysis.
"""
