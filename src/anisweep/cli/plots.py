"""The figures' commands: plot, plot-family, plot-families, plot-survey and each analysis's plot-*."""

from __future__ import annotations

from pathlib import Path

from anisweep.arguments import json_value


def cmd_plot(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.intervals import read_intervals
    from anisweep.plots.sweep import plot_model

    plot_model(read_complete_sweeps([args.sweep]), Path(args.out_dir), read_intervals(args.bootstrap))


def cmd_plot_family(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.intervals import read_intervals
    from anisweep.plots.sweep import plot_family

    plot_family(read_complete_sweeps(args.sweeps), Path(args.out), read_intervals(args.bootstrap))


def cmd_plot_families(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.families import plot_families

    plot_families(read_complete_sweeps(args.sweeps), Path(args.out))


def cmd_plot_survey(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.survey import plot_survey

    plot_survey(read_complete_sweeps(args.sweeps), Path(args.out_dir), groups=args.groups)


def cmd_plot_circuits(args) -> None:
    import polars as pl

    from anisweep.plots.circuits import plot_circuits
    from anisweep.tables import METRIC_SCHEMA, read_parquet

    weights = pl.concat([read_parquet(path) for path in args.weights])
    if weights.height == 0:  # no layout reads the architecture: the figures say so, under the model's name
        family, model = Path(args.weights[0]).parts[-4:-2]  # results/{family}/{model}/step{N}/weights.parquet
        weights = pl.DataFrame([{"family": family, "model": model}], schema=METRIC_SCHEMA)
    plot_circuits(weights, args.pairs, args.qk, args.ov, args.pairs_figure)


def cmd_plot_logit_lens(args) -> None:
    from anisweep.plots.circuits import plot_logit_lens
    from anisweep.tables import read_parquet

    plot_logit_lens(read_parquet(args.sweep), args.out)


def cmd_plot_measure(args) -> None:
    import polars as pl

    from anisweep.measures.registry import load
    from anisweep.plots.measures import plot_measure

    plot_measure(load(args.entry), pl.read_parquet(args.sweep), Path(args.out))


def cmd_plot_gradients(args) -> None:
    import polars as pl

    from anisweep.plots.gradients import plot_gradients

    plot_gradients(pl.read_parquet(args.sweep), Path(args.out_dir), names=args.figures)


def cmd_plot_untrained(args) -> None:
    from anisweep.plots.untrained import plot_untrained

    plot_untrained(Path(args.tables_dir), Path(args.out_dir))


def cmd_plot_score_hist(args) -> None:
    import polars as pl

    from anisweep.plots.distributions import score_hist_figure

    score_hist_figure(pl.concat([pl.read_parquet(p) for p in args.hists]), Path(args.out))


def cmd_plot_spectra(args) -> None:
    import polars as pl

    from anisweep.plots.spectra import spectra_figure

    spectra_figure(pl.concat([pl.read_parquet(p) for p in args.spectra]), Path(args.out))


def cmd_plot_phases(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.intervals import read_intervals
    from anisweep.plots.phases import spectral_phases
    from anisweep.tables import read_parquet

    phases = read_parquet(args.phases)
    spectral_phases(read_complete_sweeps([args.sweep]), phases, Path(args.out), read_intervals(args.bootstrap))


def cmd_plot_compare(args) -> None:
    from anisweep.plots.compare import draw_all
    from anisweep.plots.intervals import read_pair_intervals
    from anisweep.tables import read_parquet

    intervals = read_pair_intervals(args.bootstrap)
    draw_all(read_parquet(args.table), args.out_dir, seed_figures=args.seeds, intervals=intervals)


HELP_BOOTSTRAP = "bootstrap.parquet of the model(s): a band around each curve it holds an interval for"


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("plot", help="figures of one model's sweep")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--bootstrap", nargs="*", default=[], help=HELP_BOOTSTRAP)
    p.set_defaults(run=cmd_plot)

    p = sub.add_parser("plot-compare", help="figures of one model's comparisons (compare.parquet)")
    p.add_argument("--table", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--seeds", action="store_true", help="the seed comparison's figure (compare_seeds.png) alone")
    p.add_argument("--bootstrap", nargs="*", default=[], help=HELP_BOOTSTRAP + " (its comparisons' intervals)")
    p.set_defaults(run=cmd_plot_compare)

    p = sub.add_parser("plot-family", help="one figure comparing the models of a family")
    p.add_argument("--out", required=True)
    p.add_argument("sweeps", nargs="+")
    p.add_argument("--bootstrap", nargs="*", default=[], help=HELP_BOOTSTRAP + " (and its groups' tables)")
    p.set_defaults(run=cmd_plot_family)

    p = sub.add_parser("plot-families", help="one figure comparing families, the same site in every panel")
    p.add_argument("--out", required=True)
    p.add_argument("sweeps", nargs="+")
    p.set_defaults(run=cmd_plot_families)

    p = sub.add_parser("plot-survey", help="Godey et al. 2024 Section 3's figures across every model, at its last step")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--groups", type=json_value, default={}, help='JSON {"family/model": group}: a panel per group')
    p.add_argument("sweeps", nargs="+")
    p.set_defaults(run=cmd_plot_survey)

    p = sub.add_parser("plot-circuits", help="the circuits' figures of one model (its weights.parquet tables)")
    p.add_argument("--weights", nargs="+", required=True, help="weights.parquet of each checkpoint")
    p.add_argument("--qk", required=True, help="qk_circuits.png")
    p.add_argument("--ov", required=True, help="ov_circuits.png")
    p.add_argument("--pairs-figure", required=True, help="circuit_pairs.png")
    p.add_argument("pairs", nargs="*", help="weight_pairs.parquet of each checkpoint")
    p.set_defaults(run=cmd_plot_circuits)

    p = sub.add_parser("plot-logit-lens", help="the logit lens figure of one model's sweep")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_plot_logit_lens)

    p = sub.add_parser("plot-measure", help="a measure's figure of one model's sweep")
    p.add_argument("--entry", required=True, help="module:attribute of the measure")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_plot_measure)

    p = sub.add_parser("plot-gradients", help="the gradient figures of one model")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--figures", nargs="*", help="figure names to draw (default: every one the sweep has data for)")
    p.set_defaults(run=cmd_plot_gradients)

    p = sub.add_parser("plot-untrained", help="figures of the untrained-block experiment")
    p.add_argument("--tables-dir", required=True)
    p.add_argument("--out-dir", required=True)
    p.set_defaults(run=cmd_plot_untrained)

    p = sub.add_parser("plot-score-hist", help="one model's pre-softmax score histograms over training")
    p.add_argument("--out", required=True)
    p.add_argument("hists", nargs="+", help="the model's score_hist.parquet, one per step")
    p.set_defaults(run=cmd_plot_score_hist)

    p = sub.add_parser("plot-spectra", help="one model's normalised singular-value spectra over training")
    p.add_argument("--out", required=True)
    p.add_argument("spectra", nargs="+", help="spectra.parquet of each checkpoint")
    p.set_defaults(run=cmd_plot_spectra)

    p = sub.add_parser("plot-phases", help="one model's RankMe and alpha-ReQ per layer over training, phases shaded")
    p.add_argument("--sweep", required=True)
    p.add_argument("--phases", required=True, help="the model's phases.parquet")
    p.add_argument("--out", required=True)
    p.add_argument("--bootstrap", nargs="*", default=[], help=HELP_BOOTSTRAP)
    p.set_defaults(run=cmd_plot_phases)
