"""The explorer page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver` packages,
driven by Selenium) opens the page of a small results folder from disk, a metric, a layer and a model are
chosen in its controls as a user would, and the values Plotly draws are read back: each is the sweep's, at
float32. Skipped only where no Chromium is installed."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from explore_sweeps import expected, write_results

from anisweep.explore.data import read_sweeps, write_explore

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
    return root, write_explore(read_sweeps([root]), root / "explore.html")


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
        "return document.getElementById('plot').data.map(t => ({meta: t.meta, x: t.x, y: t.y}))"
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
