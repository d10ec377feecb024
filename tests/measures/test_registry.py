"""The measure registry: docs/measures.md's two examples run as written (against independent computations), and
a bad measure fails alone and clearly."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import transformers
from docs_measures import docs_package

from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run
from anisweep.extract.stream_measures import StreamMeasures
from anisweep.measures import registry
from anisweep.measures.metrics import GRADIENT_MEASURE, builtin_measures, checkpoint_metrics
from anisweep.measures.registry import MeasureError, load, run_table_measure, user_measures
from anisweep.measures.sweep import aggregate
from anisweep.tables import METRIC_SCHEMA, write_atomic

from conftest import bert_config, neox_config, padded_batch, saved

IDENT = {"family": "test", "model": "m", "seed": 0, "step": 3, "tokens_seen": 30}


@pytest.fixture
def mymeasures(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(docs_package(tmp_path / "pkg")))
    yield
    for module in [m for m in sys.modules if m == "mymeasures" or m.startswith("mymeasures.")]:
        del sys.modules[module]


def write_package(root: Path, code: str, name: str = "badmeasures") -> str:
    """A one-module package `name` holding `code` on sys.path (the caller prepends root)."""
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "m.py").write_text(textwrap.dedent(code))
    importlib.invalidate_caches()
    sys.modules.pop(f"{name}.m", None)
    sys.modules.pop(name, None)
    return f"{name}.m"


def checkpoint_folder(folder: Path, hidden: dict[tuple[int, str], np.ndarray]) -> Path:
    """A checkpoint folder with hidden.parquet of the given samples and an extract.json naming IDENT."""
    frames = []
    for (layer, site), x in hidden.items():
        frames.append(
            pl.DataFrame(
                {
                    "layer": [layer] * len(x),
                    "site": [site] * len(x),
                    "seq": list(range(len(x))),
                    "position": [0] * len(x),
                    "token_id": [0] * len(x),
                    "vector": [row.astype(np.float32).tolist() for row in x],
                }
            )
        )
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(pl.concat(frames), folder / "hidden.parquet")
    (folder / "extract.json").write_text(json.dumps({"checkpoint": IDENT}))
    return folder


def test_effective_rank_example_has_its_known_values(tmp_path, mymeasures):
    """Points +-e_i for i < r: centred, r equal singular values, so the effective rank is exactly r; an
    anisotropic Gaussian's equals exp(entropy) of its singular values computed here by numpy directly."""
    measure = load("mymeasures.rank:effective_rank")
    assert (measure.kind, measure.name, measure.tables) == ("table", "effective_rank", ("hidden",))
    d, r = 16, 5
    planted = np.concatenate([np.eye(d)[:r], -np.eye(d)[:r]]) * 3.0
    gaussian = np.random.default_rng(0).normal(size=(200, d)) * np.linspace(0.1, 2.0, d)
    folder = checkpoint_folder(tmp_path / "step3", {(1, "resid"): planted, (2, "resid"): gaussian})
    rows = run_table_measure(measure, folder)
    assert rows.schema == pl.Schema(METRIC_SCHEMA)
    got = dict(zip(rows["layer"], rows["value"]))
    assert got[1] == pytest.approx(r, rel=1e-6)
    s = np.linalg.svd(
        gaussian.astype(np.float32).astype(np.float64) - gaussian.astype(np.float32).mean(0), False, False
    )
    p = s / s.sum()
    assert got[2] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-6)
    assert set(rows["measure"]) == {"effective_rank"} and set(rows["step"]) == {3}


@pytest.mark.parametrize("kind", ["bert", "neox"])
def test_attention_output_norm_example_matches_the_output_projections_input(tmp_path, mymeasures, kind):
    """The stream example's mean norm per head against each head's slice of the input of the attention's output
    projection (a forward pre-hook there, outside anisweep's recording), over the valid tokens; mini-batches of
    2 (so the example's merge spans them) and padding."""
    cls, config = {
        "bert": (transformers.BertModel, bert_config()),
        "neox": (transformers.GPTNeoXForCausalLM, neox_config()),
    }[kind]
    path = saved(tmp_path, cls, config, kind)
    batch = padded_batch()
    measure = load("mymeasures.heads:AttentionOutputNorm")
    assert (measure.kind, measure.name, measure.sites) == ("stream", "attention_output_norm", ("attention_output",))
    loaded = load_model(path, device="cpu")
    stream = StreamMeasures([measure], loaded.geometry, "test/m/step3")
    settings = ExtractSettings(batch_size=2, sample_tokens=10_000, device="cpu")
    run(loaded, batch, settings, progress=False, stream=stream)
    rows = stream.tables(IDENT)["measures/attention_output_norm"]

    reference = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    projections = [
        (layer.attention.output.dense if kind == "bert" else layer.attention.dense)
        for layer in (reference.encoder.layer if kind == "bert" else reference.layers)
    ]
    seen = {}
    hooks = [
        p.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].detach()))
        for i, p in enumerate(projections)
    ]
    with torch.no_grad():
        reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    for hook in hooks:
        hook.remove()
    valid = batch["attention_mask"].bool()
    g = loaded.geometry
    for layer, x in seen.items():
        per_head = x.double().reshape(*x.shape[:2], g.n_heads, g.d_head)[valid].norm(dim=-1).mean(0)
        got = rows.filter(pl.col("layer") == layer).sort("head")
        assert set(got["site"]) == {"attention_output"}
        np.testing.assert_allclose(got["value"].to_numpy(), per_head.numpy(), rtol=1e-5)


def test_an_entry_that_does_not_import_is_named(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MeasureError, match=r"'nosuchpkg.m:f' does not import \(ModuleNotFoundError"):
        user_measures(["nosuchpkg.m:f"])
    module = write_package(tmp_path, "def f(tables):\n    return []\n")
    with pytest.raises(MeasureError, match=rf"'{module}:f'.*is not a measure; decorate it"):
        load(f"{module}:f")
    with pytest.raises(MeasureError, match="has no attribute 'g'"):
        load(f"{module}:g")
    with pytest.raises(MeasureError, match="must be 'module:attribute'"):
        load("effective_rank")


def test_declarations_are_checked_when_loaded(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_package(
        tmp_path,
        """
        from anisweep.measures.registry import stream_measure, table_measure

        @table_measure(tables=["hiddens"])
        def typo(tables):
            return []

        @stream_measure(sites=["resid"])
        class NoMerge:
            def __init__(self, site): ...
            def update(self, x, valid): ...
            def finalize(self): return []

        @stream_measure(sites=["attention_prob"])
        class SiteTypo:
            def update(self, x, valid): ...
            def merge(self, other): ...
            def finalize(self): ...

        @table_measure(tables=["hidden"], name="attention")
        def clash(tables):
            return []

        @table_measure(tables=["hidden"], name="same")
        def first(tables):
            return []

        @table_measure(tables=["hidden"], name="same")
        def second(tables):
            return []
        """,
    )
    with pytest.raises(MeasureError, match=r"tables=\['hiddens'\]: name the extract tables it reads"):
        load(f"{module}:typo")
    with pytest.raises(MeasureError, match=r"needs update, merge and finalize; lacks \['merge'\]"):
        load(f"{module}:NoMerge")
    with pytest.raises(
        MeasureError, match=r"sites \['attention_prob'\] match no site; the sites are \[.*'attention_probs'"
    ):
        load(f"{module}:SiteTypo")
    with pytest.raises(MeasureError, match="and a built-in measure are both named 'attention'"):
        user_measures([f"{module}:clash"])
    with pytest.raises(MeasureError, match="'.*:second' and '.*:first' are both named 'same'"):
        user_measures([f"{module}:first", f"{module}:second"])


def test_a_failing_table_measure_names_itself_and_the_checkpoint_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_package(
        tmp_path,
        """
        from anisweep.measures.registry import table_measure

        @table_measure(tables=["hidden"])
        def broken(tables):
            raise ZeroDivisionError("no tokens")

        @table_measure(tables=["hidden"])
        def extra_column(tables):
            return [{"metric": "m", "value": 1.0, "colour": "red"}]

        @table_measure(tables=["hidden"])
        def no_value(tables):
            return [{"metric": "m"}]

        @table_measure(tables=["hidden"])
        def text_value(tables):
            return [{"metric": "m", "value": "high"}]

        @table_measure(tables=["hidden"])
        def twice(tables):
            return [{"metric": "m", "value": 1.0}, {"metric": "m", "value": 2.0}]

        @table_measure(tables=["hidden"])
        def undeclared(tables):
            return [{"metric": "n", "value": float(tables.qk.height)}]
        """,
    )
    folder = checkpoint_folder(tmp_path / "step3", {(0, "resid"): np.ones((4, 3))})
    expected = {
        "broken": r"measure 'broken' \(.*:broken\) failed at test/m/step3: ZeroDivisionError: no tokens",
        "extra_column": r"measure 'extra_column' .* at test/m/step3: rows hold \['colour'\]; a row may hold only",
        "no_value": r"at test/m/step3: every row needs a 'metric' \(a string\) and a 'value'",
        "text_value": r"at test/m/step3: metric 'm' has value 'high', not a number",
        "twice": r"at test/m/step3: metrics: 2 rows share their key columns",
        "undeclared": r"at test/m/step3: reads table 'qk' but declares tables=\['hidden'\]: add it there",
    }
    for name, message in expected.items():
        with pytest.raises(MeasureError, match=message):
            run_table_measure(load(f"{module}:{name}"), folder)


def test_a_failing_stream_measure_names_itself_the_checkpoint_and_the_site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_package(
        tmp_path,
        """
        from anisweep.measures.registry import stream_measure

        @stream_measure(sites=["ln_*"])
        class Broken:
            def __init__(self, site):
                self.site = site
            def update(self, x, valid):
                if self.site.layer == 1:
                    raise RuntimeError("shape mismatch")
            def merge(self, other): ...
            def finalize(self): return []
        """,
    )
    path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "neox")
    loaded = load_model(path, device="cpu")
    stream = StreamMeasures([load(f"{module}:Broken")], loaded.geometry, "test/m/step3")
    settings = ExtractSettings(batch_size=2, sample_tokens=10_000, device="cpu")
    with pytest.raises(MeasureError, match=r"'broken' .* failed at test/m/step3, layer 1 ln_attn_in: RuntimeError"):
        run(loaded, padded_batch(), settings, progress=False, stream=stream)


def test_a_table_measure_returning_something_else_than_rows_is_named(tmp_path, monkeypatch):
    """Issue 43 item 10: an array, a tensor, a number, one dict, rows that are not dicts: a MeasureError naming the
    measure, the checkpoint, what it returned (its type, and its shape where it has one) and what is expected."""
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_package(
        tmp_path,
        """
        import numpy as np
        import torch
        from anisweep.measures.registry import table_measure

        @table_measure(tables=["hidden"])
        def array(tables):
            return np.zeros((3, 2))

        @table_measure(tables=["hidden"])
        def tensor(tables):
            return torch.zeros(4)

        @table_measure(tables=["hidden"])
        def number(tables):
            return 0.5

        @table_measure(tables=["hidden"])
        def one_row(tables):
            return {"metric": "m", "value": 1.0}

        @table_measure(tables=["hidden"])
        def pairs(tables):
            return [("m", 1.0)]
        """,
        name="wrongtypes",
    )
    folder = checkpoint_folder(tmp_path / "step3", {(0, "resid"): np.ones((4, 3))})
    expected = {
        "array": r"the table measure returned a numpy\.ndarray of shape \(3, 2\)",
        "tensor": r"the table measure returned a torch\.Tensor of shape \(4,\)",
        "number": r"the table measure returned a float",
        "one_row": r"the table measure returned a dict",
        "pairs": r"the table measure returned a row 0 that is a tuple",
    }
    for name, message in expected.items():
        where = rf"measure '{name}' \(wrongtypes\.m:{name}\) at test/m/step3: "
        with pytest.raises(MeasureError, match=where + message + r"; expected its rows: a list .* of dicts"):
            run_table_measure(load(f"{module}:{name}"), folder)


def test_a_stream_measure_whose_finalize_returns_a_tensor_is_named_with_its_site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_package(
        tmp_path,
        """
        import torch
        from anisweep.measures.registry import stream_measure

        @stream_measure(sites=["ln_attn_in"])
        class TensorRows:
            def __init__(self, site):
                self.total = torch.zeros(site.d_model, dtype=torch.float64)
            def update(self, x, valid):
                self.total += x.double().sum(dim=(0, 1))
            def merge(self, other):
                self.total += other.total
            def finalize(self):
                return self.total
        """,
        name="tensormeasure",
    )
    path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "neox")
    loaded = load_model(path, device="cpu")
    stream = StreamMeasures([load(f"{module}:TensorRows")], loaded.geometry, "test/m/step3")
    run(
        loaded,
        padded_batch(),
        ExtractSettings(batch_size=2, sample_tokens=10_000, device="cpu"),
        progress=False,
        stream=stream,
    )
    d = loaded.geometry.d_model
    message = (
        rf"measure 'tensor_rows' \(tensormeasure\.m:TensorRows\) at test/m/step3, layer 1 ln_attn_in: finalize\(\)"
        rf" returned a torch\.Tensor of shape \({d},\); expected its rows"
    )
    with pytest.raises(MeasureError, match=message):
        stream.tables(IDENT)


def test_nan_rows_are_marked_never_ok(tmp_path):
    """A user's row whose value is NaN lands in metrics.parquet and sweep.parquet with status `nan`."""
    from anisweep.extract.run import write_extract

    from conftest import run_extract

    path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "neox")
    tables, _ = run_extract(path, padded_batch())
    folder = tmp_path / "test" / "m" / "step3"
    write_extract(folder, tables, {"checkpoint": IDENT})
    measure = registry.Measure("mine", "table", lambda t: None, tables=("hidden",), entry="x:mine")
    rows = registry.measure_frame(measure, IDENT, [{"metric": "a", "value": float("nan")}, {"metric": "b", "value": 1}])
    write_atomic(rows, folder / "measures" / "mine.parquet")
    metrics = checkpoint_metrics(folder, measure_tables=[folder / "measures" / "mine.parquet"])
    write_atomic(metrics, folder / "metrics.parquet")
    sweep = aggregate([folder / "metrics.parquet"])
    mine = dict(sweep.filter(pl.col("measure") == "mine").select("metric", "status").iter_rows())
    assert mine == {"a": "nan", "b": "ok"}
    assert sweep.filter(pl.col("value").is_nan())["status"].unique().to_list() == ["nan"]


def test_the_registry_is_the_one_list_of_the_builtins():
    """metrics.BUILTIN binds a function to every name of registry.BUILTIN, in its order; the model figures are
    those the built-in measures name, and plots.sweep draws exactly them."""
    from anisweep.plots import sweep as plots

    assert [m.name for m in builtin_measures()] == list(registry.BUILTIN)
    weights = (*registry.BUILTIN_WEIGHT, registry.LOGIT_LENS_MEASURE)  # the weight measure, the logit lens
    assert registry.BUILTIN_NAMES == (*registry.BUILTIN, *weights, GRADIENT_MEASURE)
    assert [m.tables for m in builtin_measures()] == [tables for tables, _ in registry.BUILTIN.values()]
    assert plots.MODEL_FIGURES == registry.builtin_figures() and set(plots.PLOTTERS) == set(plots.MODEL_FIGURES)
