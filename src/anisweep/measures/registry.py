"""The measures: the one list of what is computed per checkpoint, the built-in ones and a user's own.

A measure is one of three kinds (docs/measures.md walks through them):

* a table measure, `@table_measure(tables=(...))` on a function of one checkpoint's Parquet tables
  (`CheckpointTables`) that returns tidy rows. It never runs a model: adding or editing one reruns its own
  jobs (rule `table_measure`), the checkpoints' metrics and what reads them, never extract.
* a stream measure, `@stream_measure(sites=(...))` on an accumulator class that extract feeds in the forward
  pass: `Cls(site)` per site (a `Site`), `update(x, valid)` with one mini-batch's activations, `merge(other)`
  to fold a mini-batch's accumulator into the running one, `finalize()` returning tidy rows. For what the
  samples cannot give, such as a statistic over every token. Editing one reruns extract.
* a weight measure, `@weight_measure(tensors=(...))` on a function of one checkpoint's weights
  (`anisweep.weights.checkpoint.CheckpointWeights`: its shapes, tokenizer and the tensors of the roles it names,
  WEIGHT_ROLES) that returns tidy rows. It never runs a forward pass and reads only the tensors it names (a Hub
  checkpoint's by range reads); adding or editing one reruns its own jobs (rule `weight_measure`), never extract.
* a comparative measure, `@comparative_measure` on a function `(x, y)` of two checkpoints' sampled hidden states
  at one layer and site (float64 arrays, n tokens x d, row i the same token in both) that returns a number or rows
  of metric and value. It runs in the comparison jobs of pairs of checkpoints (anisweep.measures.compare), beside
  CKA, SVCCA and PWCCA; its rows land in the pair tables and compare.parquet, not metrics.parquet.

Rows are dicts (or a polars DataFrame) with `metric` and `value`, and optionally `layer`, `head`, `site`,
`subspace`, `fit`, `rank`, `stratum` and `reason` (why a value is NaN); a stream measure's rows get their site's
layer and name where they leave them out. They land in metrics.parquet and sweep.parquet with `measure` = the
measure's name. A user's measure comes from the config (`measures: [mypkg.mymod:effective_rank]`) or from an
installed package's entry point in the group `anisweep.measures`; its source files are inputs of the rules that
run it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.code_inputs import imported_names
from anisweep.measures.sites import STREAM_SITES
from anisweep.tables import EXTRACT_TABLES, IDENTITY, METRIC_KEY, metric_rows, read_parquet, vectors

ENTRY_POINT_GROUP = "anisweep.measures"
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: The columns a measure's rows may hold; every other is an error naming the measure. `reason`: why a value is NaN.
ROW_COLUMNS = frozenset({*METRIC_KEY, "value", "reason"})
#: The built-in measures, in the order metrics.parquet lists them: name -> (the extract tables it reads, the figures
#: of each model that draw its rows). anisweep.measures.metrics binds each to its function (`builtin_measure`),
#: anisweep.plots.sweep draws these figures (MODEL_FIGURES), the glossary lists them. Here, so that the workflow
#: reads them without importing any numerics.
BUILTIN = {
    "qk_alignment": (("qk",), ("qk_alignment.png", "qk_mean_dot.png", "qk_cos_concat.png")),
    "attention": (("attention",), ("attention_entropy.png", "attention_softmax.png")),
    "stream_geometry": (
        ("hidden_stats",),
        ("isotropy.png", "isotropy_heatmap.png", "final_layernorm.png", "drift_vs_anisotropy.png", "norms.png"),
    ),
    "sample_geometry": (("hidden",), ("isotropy.png", "final_layernorm.png")),
    "drift_correlation": (("hidden_stats",), ("drift_vs_anisotropy.png",)),
    "layernorm": (("layernorm", "hidden_stats"), ("layernorm_params.png",)),
    "embeddings": (("embeddings",), ("layernorm_params.png",)),
    "qk_anisotropy": (("qk_sample",), ()),
    "rogue_dimensions": (("hidden_stats", "hidden"), ("rogue_dimensions.png", "avg_cos_standardised.png")),
    "massive_activations": (("hidden_stats", "hidden", "massive"), ("massive_activations.png",)),
    "attention_sinks": (("sinks", "sink_keys", "attention"), ("attention_sinks.png",)),
    "layernorm_outliers": (("layernorm", "hidden_stats"), ("layernorm_outliers.png",)),
    "spectral": (("hidden",), ()),
}
GRADIENT_MEASURE = "gradients"  # the `measure` of the gradient analysis's rows (anisweep.tangent)
#: The built-in weight measures (anisweep.measures.circuits): name -> the figures of each model that draw its rows.
BUILTIN_WEIGHT = {"circuits": ("qk_circuits.png", "ov_circuits.png", "circuit_pairs.png"), "weight_matrices": ()}
#: The logit lens's figures (anisweep.plots.circuits).
LENS_FIGURES = ("logit_lens.png",)
#: The figures of a model whose weights are read (config `weights.enabled`): the circuits' and the logit lens's.
WEIGHT_FIGURES = (*BUILTIN_WEIGHT["circuits"], *LENS_FIGURES)
#: The roles of a checkpoint's tensors a weight measure may name (anisweep.weights.layout resolves them per
#: architecture): the token embedding, the unembedding (an encoder's MLM decoder), the final norm (an encoder's MLM
#: transform LayerNorm), every layer's W_Q, W_K, W_V, W_O, and the norm before each layer's attention.
WEIGHT_ROLES = ("embedding", "unembedding", "final_norm", "attention", "attention_norm")
WEIGHT_SITE = "weights"  # the site of a weight measure's rows: the checkpoint's weights, no activations
LOGIT_LENS_MEASURE = "logit_lens"  # the `measure` of the logit lens's rows (anisweep.measures.logit_lens)
#: The names no user's measure may take.
BUILTIN_NAMES = (*BUILTIN, *BUILTIN_WEIGHT, LOGIT_LENS_MEASURE, GRADIENT_MEASURE)


def builtin_figures() -> tuple[str, ...]:
    """Every figure of a model that the built-in measures name, each once, in their order."""
    return tuple(dict.fromkeys(figure for _, figures in BUILTIN.values() for figure in figures))


class MeasureError(ValueError):
    """A measure that does not import, has the wrong shape, fails or returns rows that are not tidy: the
    message names the measure (its config entry) and, where it ran, the checkpoint."""


class InstalledMeasureError(MeasureError):
    """A measure an installed package declares (entry point) that fails to load: the package's to fix, not the
    config's; the message names the package and how to leave it out."""


@dataclass(frozen=True)
class Site:
    """Where a stream measure's accumulator listens, with the facts of the model it needs (docs/measures.md, Sites).

    `name` is the site (`resid`, a norm's `{norm}_in` / `{norm}_out`, `q`, `k`, `attention_output`,
    `attention_scores`, `attention_probs`: STREAM_SITES, named as in the glossary); for a measure that reads
    several sites together, their names joined by `+`, and `sites` lists them. `layer` numbers blocks from 0 at
    the attention sites and counts from the embeddings (0) at the hidden-state sites, as the tables do. `scaling`
    is the factor the model multiplies q.k by before the softmax (1/sqrt(d_head) in most models), given where the
    site is one of the layer's attention sites, else None; `causal` whether a query sees only earlier keys."""

    name: str
    layer: int
    d_model: int
    n_heads: int
    d_head: int
    n_layers: int = 0
    kv_heads: int = 0
    causal: bool = False
    scaling: float | None = None
    rotary_dims: int = 0
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class Measure:
    """One registered measure. `target` is the function (table) or accumulator class (stream); `tables` the
    extract tables a table measure reads, `sites` the sites a stream measure listens at (names, or name
    prefixes ending in `*`); `figure`, an optional function (sweep rows of this measure, path) that draws its
    own figure instead of the default (value over training per layer); `entry` what loads it (`module:attr`)."""

    name: str
    kind: str
    target: Callable = field(compare=False)
    tables: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()  # a weight measure's roles (WEIGHT_ROLES)
    figure: Callable | None = field(default=None, compare=False)
    entry: str = ""
    builtin: bool = False
    figures: tuple[str, ...] = ()  # the files of a model's figures/ that draw its rows
    together: bool = False  # a stream measure fed every site it listens at of one layer at once (a dict)

    def __post_init__(self):
        if not self.figures and not self.builtin and self.kind != "comparative":
            object.__setattr__(self, "figures", (f"measure_{self.name}.png",))

    @property
    def definition(self) -> str:
        """The docstring's first paragraph, on one line: the measure's glossary entry."""
        doc = inspect.getdoc(self.target) or ""
        return " ".join(doc.split("\n\n")[0].split()) or "(no docstring)"

    @cached_property
    def source_files(self) -> tuple[str, ...]:
        """The measure's module file and those of the modules of its own top-level package that it imports,
        transitively."""
        return tuple(str(path) for path in _package_closure(self.target.__module__).values())

    @cached_property
    def code_identity(self) -> str:
        """sha256 of its code: each module of `source_files` by its name and content, never its path, so that the
        same code installed elsewhere (an editable install, another environment) is the same measure. The rules
        that run it record this, so that editing its code reruns them and moving it does not."""
        digest = hashlib.sha256()
        for module, path in sorted(_package_closure(self.target.__module__).items()):
            digest.update(f"{module}\0".encode())
            digest.update(Path(path).read_bytes())
            digest.update(b"\0")
        return digest.hexdigest()

    def listens(self, site: str) -> bool:
        return any(matches(pattern, site) for pattern in self.sites)


def matches(pattern: str, site: str) -> bool:
    return site == pattern or (pattern.endswith("*") and site.startswith(pattern[:-1]))


def table_measure(
    function: Callable | None = None,
    *,
    name: str | None = None,
    tables: Iterable[str] = (),
    figure: Callable | None = None,
):
    """Register `function(tables: CheckpointTables) -> rows` as a table measure reading extract's `tables`
    (names of anisweep.tables.EXTRACT_TABLES: hidden, hidden_stats, qk, qk_sample, attention, layernorm,
    embeddings, score_hist, massive, sinks, sink_keys)."""

    def wrap(fn):
        fn.__anisweep_measure__ = dict(kind="table", name=name or fn.__name__, tables=tuple(tables), figure=figure)
        return fn

    return wrap(function) if function is not None else wrap


def builtin_measure(name: str):
    """Register a built-in table measure: its tables and figures are BUILTIN's."""
    tables, figures = BUILTIN[name]

    def wrap(fn):
        fn.__anisweep_measure__ = dict(kind="table", name=name, tables=tables, figure=None, figures=figures)
        return fn

    return wrap


def stream_measure(
    cls: type | None = None,
    *,
    name: str | None = None,
    sites: Iterable[str] = (),
    together: bool = False,
    figure: Callable | None = None,
):
    """Register an accumulator class as a stream measure listening at `sites` (Site's names). With `together`, one
    accumulator per layer gets every one of its sites there at once: `update(x, valid)` with x a dict
    {site: tensor}, e.g. `q`, `k` and `attention_probs` of one block."""

    def wrap(target):
        target.__anisweep_measure__ = dict(
            kind="stream", name=name or _snake(target.__name__), sites=tuple(sites), figure=figure, together=together
        )
        return target

    return wrap(cls) if cls is not None else wrap


def weight_measure(
    function: Callable | None = None,
    *,
    name: str | None = None,
    tensors: Iterable[str] = (),
    figure: Callable | None = None,
    builtin_figures: tuple[str, ...] = (),
):
    """Register `function(weights: CheckpointWeights) -> rows` as a weight measure reading the tensors of `tensors`
    (WEIGHT_ROLES: embedding, unembedding, final_norm, attention, attention_norm) and never running the model."""

    def wrap(fn):
        spec = dict(kind="weight", name=name or fn.__name__, tensors=tuple(tensors), figure=figure)
        fn.__anisweep_measure__ = spec | ({"figures": builtin_figures} if builtin_figures else {})
        return fn

    return wrap(function) if function is not None else wrap


def comparative_measure(function: Callable | None = None, *, name: str | None = None):
    """Register `function(x, y) -> number or rows` as a comparative measure of two checkpoints' sampled hidden
    states at one layer and site (x, y: n tokens x d float64 arrays, the same tokens row by row)."""

    def wrap(fn):
        fn.__anisweep_measure__ = dict(kind="comparative", name=name or fn.__name__, figure=None, figures=())
        return fn

    return wrap(function) if function is not None else wrap


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def measure_of(target, entry: str, builtin: bool = False) -> Measure:
    """The Measure a decorated function or class declares; a MeasureError naming `entry` otherwise."""
    spec = getattr(target, "__anisweep_measure__", None)
    if spec is None:
        raise MeasureError(
            f"measure {entry!r}: {target!r} is not a measure; decorate it with "
            "@anisweep.measures.registry.table_measure, @stream_measure, @weight_measure or @comparative_measure "
            "(docs/measures.md)"
        )
    measure = Measure(target=target, entry=entry, builtin=builtin, **spec)
    check_declaration(measure)
    return measure


def check_declaration(measure: Measure) -> None:
    where = f"measure {measure.entry!r}"
    if not NAME.match(measure.name):
        raise MeasureError(f"{where}: name {measure.name!r} must be lower case letters, digits and _")
    if measure.kind == "table":
        unknown = sorted(set(measure.tables) - set(EXTRACT_TABLES))
        if unknown or not measure.tables:
            raise MeasureError(
                f"{where}: tables={list(measure.tables)}: name the extract tables it reads, of {list(EXTRACT_TABLES)}"
            )
        if len(inspect.signature(measure.target).parameters) != 1:
            raise MeasureError(f"{where}: a table measure takes one argument, the checkpoint's tables")
    elif measure.kind == "comparative":
        if len(inspect.signature(measure.target).parameters) != 2:
            raise MeasureError(
                f"{where}: a comparative measure takes two arguments, the two checkpoints' samples (x, y)"
            )
    elif measure.kind == "weight":
        unknown = sorted(set(measure.tensors) - set(WEIGHT_ROLES))
        if unknown or not measure.tensors:
            raise MeasureError(
                f"{where}: tensors={list(measure.tensors)}: name the roles of the tensors it reads, of "
                f"{list(WEIGHT_ROLES)}"
            )
        if len(inspect.signature(measure.target).parameters) != 1:
            raise MeasureError(f"{where}: a weight measure takes one argument, the checkpoint's weights")
    else:
        if not measure.sites:
            raise MeasureError(f"{where}: sites=(): name the sites it listens at (docs/measures.md)")
        unknown = [p for p in measure.sites if not any(matches(p, site) for site in STREAM_SITES)]
        if unknown:
            raise MeasureError(f"{where}: sites {unknown} match no site; the sites are {list(STREAM_SITES)}")
        missing = [m for m in ("update", "merge", "finalize") if not callable(getattr(measure.target, m, None))]
        if missing:
            raise MeasureError(f"{where}: a stream measure's class needs update, merge and finalize; lacks {missing}")


def load(entry: str) -> Measure:
    """The measure `module:attribute` names. Import errors and anything that is not a measure are MeasureErrors
    that quote the entry."""
    module_name, _, attribute = entry.partition(":")
    if not module_name or not attribute:
        raise MeasureError(f"measures: {entry!r} must be 'module:attribute', e.g. 'mypkg.measures:effective_rank'")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any failure to import is the entry's to fix
        raise MeasureError(
            f"measures: {entry!r} does not import ({type(error).__name__}: {error}); is its package installed in "
            "this environment, or on PYTHONPATH?"
        ) from error
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise MeasureError(f"measures: {entry!r}: module {module_name} has no attribute {attribute!r}") from None
    return measure_of(target, entry)


def discovered(exclude: Iterable[str] = ()) -> list[importlib.metadata.EntryPoint]:
    """The entry points installed packages declare in the group `anisweep.measures`, but those `exclude` names
    (by the entry point's name or its package's distribution name)."""
    skip = {_normalise(name) for name in exclude}
    found = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if _normalise(ep.name) not in skip and _normalise(_distribution(ep)) not in skip:
            found.setdefault(ep.value, ep)
    return [found[value] for value in sorted(found)]


def _distribution(ep: importlib.metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "?"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def load_installed(ep: importlib.metadata.EntryPoint) -> Measure:
    """The measure an installed package's entry point names; any failure is a MeasureError naming the package,
    the entry point and how to leave it out."""
    package = _distribution(ep)
    try:
        return load(ep.value)
    except MeasureError as error:
        raise InstalledMeasureError(
            f"installed measures: the package {package!r} declares the measure entry point "
            f"'{ep.name} = {ep.value}' (group {ENTRY_POINT_GROUP}), which fails: {error}. Fix or uninstall "
            f"{package}, or leave its measures out with `installed_measures: {{exclude: [{package}]}}` in the "
            "config (`installed_measures: {enabled: false}` leaves out every installed package's)"
        ) from error


def user_measures(entries: Iterable[str] = (), installed: dict | None = None) -> list[Measure]:
    """The config's measures and the installed packages' (`installed`: the config's `installed_measures`,
    {enabled, exclude}), each once, in that order; two measures of one name, or one named as a built-in, are a
    MeasureError."""
    installed = {"enabled": True, "exclude": [], **(installed or {})}
    entries = list(dict.fromkeys(entries))
    loaded = [load(entry) for entry in entries]
    if installed["enabled"]:
        loaded += [load_installed(ep) for ep in discovered(installed["exclude"]) if ep.value not in entries]
    measures, seen = [], dict.fromkeys(BUILTIN_NAMES, "a built-in measure")
    for measure in loaded:
        if measure.name in seen:
            raise MeasureError(f"measures: {measure.entry!r} and {seen[measure.name]} are both named {measure.name!r}")
        seen[measure.name] = repr(measure.entry)
        measures.append(measure)
    return measures


def measures_of(entries: Iterable[str]) -> list[Measure]:
    """The measures `entries` name, each once, in that order (a job's command names every measure it runs)."""
    return [load(entry) for entry in dict.fromkeys(entries)]


# --------------------------------------------------------------------------- rows


def measure_frame(measure: Measure, ident: dict, rows, defaults: dict | None = None) -> pl.DataFrame:
    """A measure's rows as metric rows (METRIC_SCHEMA, `measure` its name) with the checkpoint's identity.
    Columns outside ROW_COLUMNS, rows without metric or value, values that are not numbers and two rows of
    one key are MeasureErrors naming the measure and the checkpoint."""
    where = f"measure {measure.name!r} ({measure.entry}) at {checkpoint_name(ident)}"
    if defaults and "site" in defaults:
        where += f", layer {defaults.get('layer')} {defaults['site']}"
    rows = [dict(defaults or {}) | dict(r) for r in _row_dicts(rows, where, measure.kind)]
    for r in rows:
        unknown = set(r) - ROW_COLUMNS
        if unknown:
            raise MeasureError(f"{where}: rows hold {sorted(unknown)}; a row may hold only {sorted(ROW_COLUMNS)}")
        if "metric" not in r or "value" not in r or not isinstance(r["metric"], str):
            raise MeasureError(f"{where}: every row needs a 'metric' (a string) and a 'value': got {r}")
        if r["value"] is not None and not _is_number(r["value"]):
            raise MeasureError(f"{where}: metric {r['metric']!r} has value {r['value']!r}, not a number")
        if r.get("reason") is not None and not isinstance(r["reason"], str):
            raise MeasureError(f"{where}: metric {r['metric']!r} has reason {r['reason']!r}, not a string")
    try:
        return metric_rows(ident, rows, measure.name)
    except (ValueError, TypeError, pl.exceptions.PolarsError) as error:
        raise MeasureError(f"{where}: {error}") from error


#: What a measure returns (docs/measures.md, Rows), said where it returns something else.
EXPECTED_ROWS = (
    "expected its rows: a list (or any iterable) of dicts, each with 'metric' and 'value', or a polars DataFrame of "
    "them (docs/measures.md, Rows)"
)


def _row_dicts(rows, where: str, kind: str) -> list:
    """The rows a measure returned, as a list of mappings; anything else (an array, a tensor, a number, one dict, a
    row that is not a dict) a MeasureError naming what was returned and what is expected."""
    returned = f"{where}: {'finalize()' if kind == 'stream' else 'the ' + kind + ' measure'} returned"
    if rows is None:
        return []
    if isinstance(rows, pl.DataFrame):
        return rows.to_dicts()
    if isinstance(rows, (str, bytes, Mapping)) or hasattr(rows, "shape") or not isinstance(rows, Iterable):
        raise MeasureError(f"{returned} {described(rows)}; {EXPECTED_ROWS}")
    rows = list(rows)
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise MeasureError(f"{returned} a row {i} that is {described(r)}; {EXPECTED_ROWS}")
    return rows


def described(value) -> str:
    """What a value is, for an error: its type (with its module, but builtins) and its shape where it has one."""
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    shape = getattr(value, "shape", None)
    return f"a {name}" + (f" of shape {tuple(shape)}" if shape is not None else "")


def taken(rows):
    """A generator's rows listed (where the caller blames the measure's own code for what fails while they are
    made); anything else as it is, for measure_frame to check."""
    return list(rows) if isinstance(rows, Iterator) else rows


def _is_number(value) -> bool:
    try:
        return isinstance(float(value), float) and not isinstance(value, (str, bytes, bool))
    except (TypeError, ValueError):
        return False


def checkpoint_name(ident: dict) -> str:
    return f"{ident.get('family')}/{ident.get('model')}/step{ident.get('step')}"


# --------------------------------------------------------------------------- table measures


class CheckpointTables:
    """One checkpoint's extract tables, read on first use: `tables.hidden`, `tables.qk`, ... (DataFrames as
    anisweep.tables.EXTRACT_SCHEMAS describes them, with the identity columns), `tables.identity` (family,
    model, seed, step, tokens_seen) and `tables.samples()`, the sampled hidden states as arrays. `settings`: the
    config's settings of the built-in measures (`sink_epsilon`), read by them alone."""

    def __init__(self, folder: str | Path, allowed: Iterable[str] | None = None, settings: Mapping | None = None):
        self.folder = Path(folder)
        self.allowed = None if allowed is None else frozenset(allowed)
        self.settings = dict(settings or {})
        self._read: dict[str, pl.DataFrame] = {}

    def __getattr__(self, name: str) -> pl.DataFrame:
        if name.startswith("_") or name not in EXTRACT_TABLES:
            raise AttributeError(name)
        if self.allowed is not None and name not in self.allowed:
            raise MeasureError(f"reads table {name!r} but declares tables={sorted(self.allowed)}: add it there")
        if name not in self._read:
            self._read[name] = read_parquet(self.folder / f"{name}.parquet")
        return self._read[name]

    @property
    def identity(self) -> dict:
        checkpoint = json.loads((self.folder / "extract.json").read_text())["checkpoint"]
        return {key: checkpoint.get(key) for key in IDENTITY}

    def samples(self, site: str | None = None) -> dict[tuple[int, str], np.ndarray]:
        """The sampled hidden states (hidden.parquet) per (layer, site), float64 arrays (tokens, d_model), the
        tokens in one order at every site; with `site`, that site's only."""
        hidden = self.hidden if site is None else self.hidden.filter(pl.col("site") == site)
        return {
            (layer, name): vectors(group.sort("seq", "position")["vector"]).astype(np.float64)
            for (layer, name), group in sorted(hidden.group_by("layer", "site"), key=lambda g: g[0])
        }


def run_table_measure(measure: Measure, folder: str | Path) -> pl.DataFrame:
    """Run a table measure on the checkpoint in `folder` (its extract tables and extract.json)."""
    tables = CheckpointTables(folder, measure.tables)
    ident = tables.identity
    try:
        rows = taken(measure.target(tables))
    except MeasureError as error:
        where = f"measure {measure.name!r} ({measure.entry}) at {checkpoint_name(ident)}"
        raise MeasureError(f"{where}: {error}") from error
    except Exception as error:
        raise MeasureError(
            f"measure {measure.name!r} ({measure.entry}) failed at {checkpoint_name(ident)}: "
            f"{type(error).__name__}: {error}"
        ) from error
    return measure_frame(measure, ident, rows)


# --------------------------------------------------------------------------- source files


def _package_closure(module: str) -> dict[str, Path]:
    """{module name: file} of `module` and the modules of its top-level package it imports, transitively."""
    top = module.split(".")[0]
    seen, todo, files = set(), [module], {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        files[name] = Path(spec.origin).resolve()
        package = name if Path(spec.origin).name == "__init__.py" else name.rpartition(".")[0]
        todo += [imported for imported in imported_names(Path(spec.origin), package) if _exists(imported, top)]
    return dict(sorted(files.items()))


def _exists(name: str, top: str) -> bool:
    if name.split(".")[0] != top:
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
