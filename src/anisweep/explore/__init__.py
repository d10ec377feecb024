"""The explorer: one self-contained HTML page of a results folder's per-layer metrics over training (`anisweep
explore results/`, the workflow's results/explore.html). `data` reads and packs the sweeps' rows, `page` writes the
HTML around them with Plotly's JavaScript inline."""
