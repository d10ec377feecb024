"""The explorer page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver` packages,
driven by Selenium) opens the page of a small results folder from disk, a metric, a layer and a model are
chosen in its controls as a user would, and the values Plotly draws are read back: each is the sweep's, at
float32. Skipped only where no Chromium is installed."""

from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest
from explore_sweeps import (
    HOSTILE,
    expected,
    expected_intervals,
    write_gaps,
    write_hostile,
    write_intervals,
    write_results,
)

from anisweep.explore.data import scan_sweeps, write_explore

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the `test` extra) drives the browser")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,  # a browser start: seconds
    pytest.mark.skipif(
        not (CHROMIUM and DRIVER), reason="no Chromium: apt-get install -y chromium chromium-driver (Debian)"
    ),
]


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore") / "results"
    write_results(root)
    return root, write_explore(scan_sweeps([root]), root / "explore.html")


@pytest.fixture(scope="module")
def gaps(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore") / "results"
    write_gaps(root)
    return root, write_explore(scan_sweeps([root]), root / "explore.html")


@pytest.fixture(scope="module")
def banded(tmp_path_factory):
    """write_results with pythia-70m's bootstrap.parquet (explore_sweeps.write_intervals)."""
    root = tmp_path_factory.mktemp("explore") / "results"
    write_results(root)
    return root, write_explore(scan_sweeps([root]), root / "explore.html", bootstrap=write_intervals(root))


def _draws(driver) -> int:
    return int(driver.execute_script("return document.body.dataset.draws || '0'"))


def _choose(driver, id_: str, *values: str) -> None:
    """Pick `values` in the control `id_` by clicking, as a user does; wait for the redraw."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

    before = _draws(driver)
    control = Select(driver.find_element(By.ID, id_))
    if control.is_multiple:
        control.deselect_all()
    for value in values:
        control.select_by_value(value)
    WebDriverWait(driver, 30).until(lambda d: _draws(d) > before)


def _drawn(driver) -> list[dict]:
    return driver.execute_script(
        "return document.getElementById('plot').data.map(t => ({meta: t.meta, x: t.x, y: t.y, fill: t.fill}))"
    )


def _click(driver, id_: str) -> None:
    """Click the checkbox `id_` as a user does; wait for the redraw."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    before = _draws(driver)
    driver.find_element(By.ID, id_).click()
    WebDriverWait(driver, 30).until(lambda d: _draws(d) > before)


def _notes(driver) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('#notes li')].map((li) => li.textContent)")


def _panels(driver) -> dict[str, str]:
    """{the title drawn above each panel: the x axis of the panel it stands on}."""
    return driver.execute_script(
        "const g = document.getElementById('plot');"
        "return Object.fromEntries(g.layout.annotations.map((a) => [a.text, a.xref.split(' ')[0]]))"
    )


def _open(browser, path) -> None:
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get(path.as_uri())
    WebDriverWait(browser, 60).until(lambda d: _draws(d) >= 1)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_the_chosen_metric_layer_and_model_are_drawn_with_the_sweeps_values(browser, page):
    root, path = page
    _open(browser, path)
    _choose(browser, "xscale", "linear")
    _choose(browser, "metric", "entropy_mean")  # its only site, attention, follows
    _choose(browser, "layers", "1")
    _choose(browser, "models", "pythia/pythia-70m")  # its label
    (trace,) = _drawn(browser)
    assert trace["meta"] == {
        "family": "pythia",
        "model": "pythia-70m",
        "seed": 0,
        "site": "attention",
        "metric": "entropy_mean",
        "layer": 1,
    }
    rows = expected(root, "pythia", "pythia-70m", 0, "attention", "entropy_mean", 1)
    assert trace["x"] == rows["step"].to_list()  # step 8, a duplicate, is left out
    assert np.array_equal(np.array(trace["y"], dtype=np.float64), rows["value"].to_numpy().astype(np.float32))

    _choose(browser, "x", "tokens")
    (trace,) = _drawn(browser)
    assert trace["x"] == rows["tokens_seen"].to_list()


def test_the_survey_view_draws_each_model_across_depth_at_its_last_step(browser, page):
    root, path = page
    _open(browser, path)
    _choose(browser, "view", "survey")
    drawn = {(t["meta"]["model"], t["meta"]["seed"]): t for t in _drawn(browser)}
    assert set(drawn) == {("toy-neox", 0), ("toy-neox", 1), ("pythia-70m", 0)}
    trace = drawn[("pythia-70m", 0)]
    last = [expected(root, "pythia", "pythia-70m", 0, "resid", "avg_cos", layer)[-1] for layer in range(4)]
    assert trace["meta"]["step"] == 512 and trace["x"] == [0, 1 / 3, 2 / 3, 1]
    assert np.array_equal(np.array(trace["y"]), np.array([r["value"][0] for r in last], dtype=np.float32))


def test_a_chosen_model_without_values_for_the_choice_is_named_and_no_panel_is_left_to_it(browser, gaps):
    _, path = gaps
    _open(browser, path)
    _choose(browser, "metric", "isoscore")  # neither tiny-hub nor live-run has it: named in the models' order
    drawn = _drawn(browser)
    assert {t["meta"]["model"] for t in drawn} == {"toy-neox", "pythia-70m"}
    assert _notes(browser) == ["Not drawn, no isoscore at resid: tiny-hub seed 0, live-run seed 0."]
    panels = _panels(browser)  # a title per drawn panel, each above its own traces
    assert set(panels) == {"pythia/pythia-70m seed 0", "toy-neox seed 0", "toy-neox seed 1"}
    axes = browser.execute_script("return document.getElementById('plot').data.map((t) => [t.name, t.xaxis])")
    for title, axis in panels.items():
        assert {xaxis for name, xaxis in axes if name.startswith(title + " ")} == {axis}

    _choose(browser, "metric", "avg_cos")
    _choose(browser, "layers", "3")  # pythia-70m's alone
    assert {t["meta"]["model"] for t in _drawn(browser)} == {"pythia-70m"}
    assert _notes(browser) == [
        "Not drawn, none of the chosen layers: tiny-hub seed 0, live-run seed 0, toy-neox seed 0, toy-neox seed 1."
    ]

    _choose(browser, "metric", "entropy_mean")
    _choose(browser, "view", "survey")
    assert {t["meta"]["model"] for t in _drawn(browser)} == {"toy-neox", "pythia-70m", "live-run"}
    assert _notes(browser) == ["Not drawn, no entropy_mean at attention: tiny-hub seed 0."]
    _choose(browser, "view", "per-model")


def test_on_the_tokens_axis_steps_without_tokens_seen_are_left_out_and_named(browser, gaps):
    root, path = gaps
    _open(browser, path)
    _choose(browser, "layers", "0")
    _choose(browser, "x", "tokens")  # on the log scale, the default
    drawn = {t["meta"]["model"]: t for t in _drawn(browser)}
    assert set(drawn) == {"toy-neox", "pythia-70m", "live-run"}  # tiny-hub is not drawn at x = 1
    live = expected(root, "local", "live-run", 0, "resid", "avg_cos", 0).filter(pl.col("tokens_seen").is_not_null())
    assert drawn["live-run"]["x"] == [t + 1 for t in live["tokens_seen"]] == [1, 2049, 16385]
    assert np.array_equal(np.array(drawn["live-run"]["y"]), live["value"].to_numpy().astype(np.float32))
    assert _notes(browser) == [
        "Not drawn on the tokens axis, no tokens seen recorded (x axis: step draws it): tiny-hub seed 0.",
        "Steps without tokens seen left out of the tokens axis: live-run seed 0 (2 of 5).",
    ]
    _choose(browser, "xscale", "linear")
    assert {t["meta"]["model"] for t in _drawn(browser)} == {"toy-neox", "pythia-70m", "live-run"}

    _choose(browser, "x", "step")
    drawn = {t["meta"]["model"]: t for t in _drawn(browser)}
    assert drawn["tiny-hub"]["x"] == [0, 1, 8, 64, 512] and _notes(browser) == []
    _choose(browser, "xscale", "log")


def test_markup_in_names_and_folders_is_shown_as_written(browser, tmp_path):
    root = tmp_path / "results<!--<script>"
    write_hostile(root)
    _open(browser, write_explore(scan_sweeps([root]), root / "explore.html"))
    options = browser.execute_script("return [...document.getElementById('metric').options].map((o) => o.value)")
    assert HOSTILE["metric"] in options
    _choose(browser, "metric", HOSTILE["metric"])
    _choose(browser, "layers", "1")
    (trace,) = _drawn(browser)
    assert trace["meta"] == {
        "family": HOSTILE["family"],
        "model": HOSTILE["model"],
        "seed": 0,
        "site": HOSTILE["site"],
        "metric": HOSTILE["metric"],
        "layer": 1,
    }
    shown = browser.execute_script(
        "const text = (selector) => document.querySelector('#plot ' + selector).textContent;"
        "return [text('.ytitle'), text('.annotation')]"
    )
    assert shown == [f"{HOSTILE['metric']} ({HOSTILE['site']})", f"{HOSTILE['family']}/{HOSTILE['model']} seed 0"]


def _trace(drawn: list[dict], model: str, layer: int, band: str | None) -> dict:
    """The one trace of `drawn` of the model's layer: its line (`band` None) or its band's low or high edge."""
    (trace,) = [
        t for t in drawn if (t["meta"]["model"], t["meta"]["layer"], t["meta"].get("band")) == (model, layer, band)
    ]
    return trace


def _as_drawn(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def test_interval_bands_are_the_tables_low_and_high_and_the_checkbox_shows_and_hides_them(browser, banded):
    root, path = banded
    _open(browser, path)
    assert browser.execute_script("return document.getElementById('bands').checked")
    _choose(browser, "xscale", "linear")
    _choose(browser, "metric", "isoscore")
    _choose(browser, "layers", "1", "2")
    _choose(browser, "models", "pythia/pythia-70m", "toy-neox")
    drawn = _drawn(browser)
    bands = [t for t in drawn if "band" in t["meta"]]
    assert {(t["meta"]["model"], t["meta"]["layer"], t["meta"]["band"]) for t in bands} == {
        ("pythia-70m", layer, end) for layer in (1, 2) for end in ("low", "high")
    }  # toy-neox has no bootstrap.parquet: its lines alone
    for layer in (1, 2):
        want = expected_intervals(root, layer)
        line, low, high = (_trace(drawn, "pythia-70m", layer, band) for band in (None, "low", "high"))
        assert drawn.index(low) + 1 == drawn.index(high) and high["fill"] == "tonexty"  # filled down to low
        assert low["x"] == high["x"] == line["x"] == want["step"].to_list() == [0, 1, 64, 512]
        for trace, end in ((low, "low"), (high, "high")):
            wanted = want[end].fill_null(float("nan")).to_numpy().astype(np.float32).astype(np.float64)
            assert np.array_equal(_as_drawn(trace["y"]), wanted, equal_nan=True), end
        assert low["y"][2] is None  # step 64: no interval (every replicate undefined)
        assert low["meta"]["level"] == "90% interval, Multi-Bootstrap over sequences"
    note = browser.execute_script("return document.getElementById('bandnote').textContent")
    assert note == "Shaded: the 90% interval, Multi-Bootstrap over sequences (docs/measures.md)."

    _click(browser, "bands")
    hidden = _drawn(browser)
    assert [t["meta"] for t in hidden] == [t["meta"] for t in drawn if "band" not in t["meta"]]
    assert browser.execute_script("return document.getElementById('bandnote').textContent") == ""
    _click(browser, "bands")
    assert [t["meta"] for t in _drawn(browser)] == [t["meta"] for t in drawn]

    _choose(browser, "metric", "avg_cos")  # no intervals of it
    assert not [t for t in _drawn(browser) if "band" in t["meta"]]


def test_a_page_without_intervals_has_no_band_checkbox_to_show(browser, page):
    _, path = page
    _open(browser, path)
    hidden = browser.execute_script(
        "const b = document.getElementById('bands'); return [b.checked, b.parentElement.hidden]"
    )
    assert hidden == [False, True]
    assert all("band" not in t["meta"] for t in _drawn(browser))
