"""Every code block of README.md, docs/*.md and config/README.md, as a user would paste it.

- python: executed in a temporary directory, after a setup that gives it what the page says it needs (a results
  folder, a model in training); docs/measures.md's package files (`# mymeasures/...`) are run by the tests that
  build tests/docs_measures.py's package from them;
- yaml: validated as a config (anisweep.config.complete), a snippet merged into a minimal config, and its Hub
  and toy models resolved (names, steps, sizes; a local run's folder is not there to resolve, nor a `hub` entry's
  repository, whose steps are read from the Hub: tests/checkpoints/test_hub_repo.py resolves such entries from a
  cache);
- toml: parsed;
- bash: each `snakemake` command dry-run (`-n`; `--unlock` runs as it is) in a clone-like directory, `my.yaml`
  being the tiny test config (slow: about 2 s each);
- text: output or a listing, not code.

A block that cannot run here is listed in NOT_RUN with the reason; a block none of these runs fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
import yaml
from docs_measures import docs_package

from anisweep.config import checkpoints, complete

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")), "config/README.md"]
LANGUAGES = {"python", "yaml", "toml", "bash", "text"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for m in re.finditer(r"^```([^\n]*)\n(.*?)^```$", text, re.M | re.S):
            found.append(Block(page, text.count("\n", 0, m.start()) + 1, m[1].strip(), m[2]))
    return found


def matching(page: str, marker: str) -> list[Block]:
    """The blocks of `page` that hold `marker`."""
    return [b for b in blocks() if b.page == page and marker in b.code]


#: (page, a string only that block holds): why it cannot run here
NOT_RUN = {
    ("README.md", "python3.11 -m venv"): "a new virtual environment installed from PyPI, then the whole default sweep "
    "(minutes) and the whole test suite: the README's two commands, run from a fresh clone by hand",
    (
        "README.md",
        "--directory /scratch/run1",
    ): "installs from PyPI; my.yaml there is the config above it, whose models "
    "download from the Hub and whose local run is /data/run",
    ("docs/papers.md", "godey2024_survey.yaml"): "installs from PyPI and downloads seven models and WikiText-103 "
    "from the Hub (tests/workflow/test_survey.py runs this config offline, tiny models under the same repository ids)",
    ("README.md", 'pip install -e ".[slurm]"'): "installs from PyPI and submits to a SLURM cluster "
    "(tests/workflow/test_slurm.py runs the profile on a one-node SLURM it starts)",
    ("docs/slurm.md", 'pip install -e ".[slurm]"'): "installs from PyPI",
    ("README.md", "xdg-open results/explore.html"): "opens a browser; tests/test_explore.py runs `anisweep explore` "
    "on a results folder and tests/test_explore_browser.py opens its page in headless Chromium",
    ("docs/live.md", "tensorboard --logdir"): "starts TensorBoard's server; docs/live.md's callback block runs with "
    'report_to=["tensorboard"] and its test reads the event file back with TensorBoard\'s own reader',
    ("docs/modalities.md", "--configfile my_images.yaml"): "my_images.yaml is the config above it, whose ViT "
    "downloads from the Hub and whose images are the user's (tests/workflow/test_media_run.py runs it offline, a tiny "
    "ViT under the same repository id, on images it makes)",
    ("docs/modalities.md", "godey2024_modalities_vision.yaml"): "installs from PyPI and downloads nine models and two "
    "datasets from the Hub (tests/workflow/test_modalities_config.py dry-runs both configs offline on the same ids)",
    ("docs/hub.md", "anisweep audit pythia pythia-2.8b"): "asks the Hub for pythia-2.8b's 155 branches "
    "(tests/checkpoints/test_audit.py runs the command against a local Hub serving a planted grid)",
    ("docs/slurm.md", "--workflow-profile profiles/slurm"): "submits to a SLURM cluster "
    "(tests/workflow/test_slurm.py runs the profile on a one-node SLURM it starts)",
}


def measures_package_file(b: Block) -> str | None:
    """The file of docs/measures.md's example package that a python block is (its first line names it)."""
    m = re.match(r"# (mymeasures/\w+\.py)\n", b.code)
    return m[1] if b.page == "docs/measures.md" and m else None


# Python blocks: what each needs, set up in the working directory, and what it must have done.


def results_folder(tmp_path: Path):
    """README, Reading the results from Python: two models, two checkpoints each, with metrics and a sweep."""
    for model in ("toy-bert", "toy-neox"):
        rows = []
        for step in (0, 64):
            ident = {"family": "toy", "model": model, "seed": 0, "step": step, "tokens_seen": step * 1024}
            values = {"avg_cos": 0.5, "isoscore": 0.5, "massive_dim_1": 7.0 if model == "toy-bert" else float(step)}
            frame = pl.DataFrame(
                [
                    {**ident, "layer": 0, "site": "resid", "head": None, "metric": m, "value": v}
                    for m, v in values.items()
                ]
            )
            (tmp_path / f"results/toy/{model}/step{step}").mkdir(parents=True)
            frame.write_parquet(tmp_path / f"results/toy/{model}/step{step}/metrics.parquet")
            rows.append(frame.with_columns(status=pl.lit("ok")))
        pl.concat(rows).write_parquet(tmp_path / f"results/toy/{model}/sweep.parquet")

    def check(namespace):
        assert namespace["avg_cos"].height == 4 and set(namespace["avg_cos"]["metric"]) == {"avg_cos"}
        assert namespace["sweeps"].height == 12
        identity = namespace["identity"]  # issue 43: model by model, not the two models' rows mixed per layer
        bert, neox = (identity.filter(pl.col("model") == m).sort("step") for m in ("toy-bert", "toy-neox"))
        assert bert["dim"].to_list() == [7, 7] and bert["same_as_last"].all()
        assert neox["dim"].to_list() == [0, 64] and neox["same_as_last"].to_list() == [False, True]
        assert identity.height == 4 and identity["share_as_last"].sort().to_list() == [0.5, 0.5, 1.0, 1.0]

    return {}, check


def trainer_run(tmp_path: Path):
    """docs/live.md: a tiny GPT-NeoX in training, the Trainer's arguments and data."""
    pytest.importorskip("accelerate")  # the `live` extra, which docs/live.md names
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, TrainingArguments

    from anisweep.corpus import load_texts, make_batch
    from anisweep.toy.tokenizers import build_neox_tokenizer

    try:  # the `test` extra has it; the block runs without it too
        from tensorboard.backend.event_processing import event_accumulator as tensorboard
    except ImportError:
        tensorboard = None
    texts = load_texts({"source": "builtin"})[:400]
    tokenizer = build_neox_tokenizer(texts, 256)
    torch.manual_seed(0)
    config = GPTNeoXConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    model = GPTNeoXForCausalLM(config)
    windows = make_batch(tokenizer, texts, 8, 32, seed=1)["input_ids"]
    namespace = {
        "eval_texts": texts,
        "tokenizer": tokenizer,
        "model": model,
        "train": [{"input_ids": ids, "labels": ids} for ids in windows],
        "args": TrainingArguments(
            output_dir=str(tmp_path / "trainer"),
            max_steps=1,
            per_device_train_batch_size=4,
            use_cpu=True,
            report_to=["tensorboard"] if tensorboard else "none",
            disable_tqdm=True,
            save_strategy="no",
            logging_strategy="no",
        ),
    }

    def check(namespace):
        assert (tmp_path / "results/local/my-run/step0/extract.json").is_file()
        assert (tmp_path / "results/local/my-run/step0/gradient_sums.parquet").is_file()
        if tensorboard:  # docs/live.md's `tensorboard --logdir out/runs` shows these
            (events,) = (tmp_path / "trainer" / "runs").rglob("events.out.tfevents.*")
            reader = tensorboard.EventAccumulator(str(events.parent))
            reader.Reload()
            assert "train/geometry/avg_cos/resid/layer_2" in reader.Tags()["scalars"]

    return namespace, check


def own_figure(tmp_path: Path):
    """docs/measures.md, Its figure: the decorator of the example before it in scope."""
    from anisweep.measures.registry import table_measure

    def check(namespace):
        assert callable(namespace["effective_rank"]) and callable(namespace["draw"])

    return {"table_measure": table_measure}, check


def module_names(tmp_path: Path):
    """docs/adapters.md, Find the module names: a tiny ALBERT's modules, among them the ones the adapter hooks."""

    def check(namespace):
        names = [name for name, _ in namespace["model"].named_modules()]
        assert {"encoder.embedding_hidden_mapping_in", "encoder.albert_layer_groups.0.albert_layers.0"} <= set(names)

    return {}, check


def phase_rule(tmp_path: Path):
    """docs/measures.md, Phases of training: the phases the block's comments show are the ones it prints."""
    from anisweep.measures.phases import curve_phases

    (b,) = matching("docs/measures.md", "curve_phases(steps, rankme")
    shown = [line.removeprefix("# ").split() for line in b.code.splitlines() if line.startswith("# ")]

    def check(namespace):
        found = curve_phases(namespace["steps"], namespace["rankme"], 1, smooth=1, tolerance=0.05, min_steps=5)
        assert [[p["phase"], str(p["start_step"]), str(p["end_step"])] for p in found] == shown

    return {}, check


def multibootstrap_example(tmp_path: Path):
    """docs/measures.md, the Multi-Bootstrap: the earlier step's band holds its estimate, and the 1% rise every seed
    makes is seen by the paired test in every replicate (p at its floor, 2 / B)."""

    def check(namespace):
        band, step = namespace["band"], namespace["step"]
        assert band.low < band.estimate < band.high and band.design == "seeds and units"
        assert step.design == "paired" and step.low > 0 and step.p == 2 / step.samples

    return {}, check


def bootstrap_results(tmp_path: Path):
    """docs/results.md, the bootstrap tables: the rows tests/test_results_bootstrap.py writes, read back."""
    from test_results_bootstrap import TESTS, write_results

    write_results(tmp_path / "results")

    def check(namespace):
        assert namespace["intervals"].height == 3 * 12 and namespace["between_groups"].height == 1
        changed = sum(listed for *_, listed in TESTS)
        moved = namespace["moved"]  # a's and the group's listed tests, and b's (shifted) previous-step ones
        assert moved.height == 2 * changed + 5 and set(moved["against"]) == {"previous"}

    return {}, check


#: (page, a string only that block holds): its setup
PYTHON = {
    ("README.md", "from anisweep.results import"): results_folder,
    ("docs/live.md", "AnisweepCallback("): trainer_run,
    ("docs/measures.md", "figure=draw"): own_figure,
    ("docs/measures.md", "curve_phases(steps, rankme"): phase_rule,
    ("docs/measures.md", "bootstrap.compare(earlier, later"): multibootstrap_example,
    ("docs/results.md", 'changes("results")'): bootstrap_results,
    ("docs/adapters.md", "named_modules()"): module_names,
}

#: docs/adapters.md's worked example shows the ALBERT adapter's own methods: (a string only that block holds)
ALBERT = Path(__file__).resolve().parents[1] / "src" / "anisweep" / "adapters" / "albert.py"
ADAPTER_EXCERPTS = ("def geometry(self, config)", "def applications(base)", "def resid_sites(self, base)")


def adapter_excerpt(b: Block) -> bool:
    return b.page == "docs/adapters.md" and any(marker in b.code for marker in ADAPTER_EXCERPTS)


#: the config a snippet is merged into (its top-level keys replace these)
MINIMAL = {
    "models": [{"family": "toy", "name": "toy-neox", "steps": "all"}],
    "toy": {"toy-neox": {"arch": "gpt_neox", "steps": [0, 16, 64, 1000]}},
    "extract": {"seq_len": 64},
}


def runs_here(b: Block) -> bool:
    if b.language == "python":
        return any(b in matching(*key) for key in PYTHON)
    if b.language == "bash":
        return all(command.startswith("snakemake ") for command in commands(b))
    return b.language in ("yaml", "toml", "text")


def commands(b: Block) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in b.code.splitlines() if line.split("#", 1)[0].strip()]


def not_run() -> list[Block]:
    return [b for key in NOT_RUN for b in matching(*key)]


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_every_block_is_run_or_listed():
    assert not [key for key in [*NOT_RUN, *PYTHON] if len(matching(*key)) != 1], "each entry names one block"
    unknown = [str(b) for b in blocks() if b.language not in LANGUAGES]
    assert not unknown, f"a fence without one of the languages {sorted(LANGUAGES)}: {unknown}"
    listed = [b for b in blocks() if b in not_run() or measures_package_file(b) or adapter_excerpt(b)]
    neither = [str(b) for b in blocks() if b not in listed and not runs_here(b)]
    assert not neither, f"blocks neither run nor listed in NOT_RUN: {neither}"


def test_measures_package_blocks_are_the_package_tests_build(tmp_path):
    """docs/measures.md's `# mymeasures/...` blocks are the files of the package tests/docs_measures.py builds,
    which tests/measures/test_registry.py and tests/workflow/test_measures.py run."""
    root = docs_package(tmp_path)
    files = {measures_package_file(b): b.code for b in blocks() if measures_package_file(b)}
    assert files
    for path, code in files.items():
        assert (root / path).read_text() == code.split("\n", 1)[1], path  # the file, under its name's line


def test_the_adapter_walkthrough_shows_the_adapters_own_code():
    """Each excerpt of docs/adapters.md's ALBERT example, its lines as they stand in adapters/albert.py (indented
    one level there, in the class)."""
    source = [line.strip() for line in ALBERT.read_text().splitlines() if line.strip()]
    excerpts = [b for b in blocks() if adapter_excerpt(b)]
    assert len(excerpts) == len(ADAPTER_EXCERPTS)
    for b in excerpts:  # blank lines aside: the page separates its excerpts as top-level functions
        lines = [line.strip() for line in b.code.splitlines() if line.strip()]
        starts = [i for i, line in enumerate(source) if line == lines[0]]
        assert any(source[i : i + len(lines)] == lines for i in starts), str(b)


# docs/live.md's callback is asked for steps 100 and 1000, past the test's one training step: warned about
@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.filterwarnings("ignore:AnisweepCallback:UserWarning")
@pytest.mark.parametrize("key", list(PYTHON), ids=[f"{page}:{marker}" for page, marker in PYTHON])
def test_python_block(key, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace, check = PYTHON[key](tmp_path)
    (b,) = matching(*key)
    exec(compile(b.code, str(b), "exec"), namespace)
    check(namespace)


YAML = [b for b in blocks() if b.language == "yaml"]


@pytest.mark.parametrize("b", YAML, ids=[str(b) for b in YAML])
def test_yaml_block_is_a_valid_config(b):
    config = complete({**MINIMAL, **yaml.safe_load(b.code)})
    resolvable = [entry for entry in config["models"] if entry["family"] not in ("local", "hub")]
    if resolvable:
        assert checkpoints({**config, "models": resolvable})


TOML = [b for b in blocks() if b.language == "toml"]


@pytest.mark.parametrize("b", TOML, ids=[str(b) for b in TOML])
def test_toml_block_parses(b):
    assert tomllib.loads(b.code)


def clone_like(tmp_path: Path) -> Path:
    """A directory that runs the workflow as a clone does, with `my.yaml` the tiny test config."""
    for name in ("Snakefile", "workflow", "config", "profiles"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "my.yaml").write_text((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
    return tmp_path


SNAKEMAKE = [
    (b, command)
    for b in blocks()
    if b.language == "bash" and b not in not_run()
    for command in commands(b)
    if command.startswith("snakemake ")
]


@pytest.mark.slow
@pytest.mark.parametrize("b, command", SNAKEMAKE, ids=[f"{b}: {c}" for b, c in SNAKEMAKE])
def test_snakemake_command_dry_runs(b, command, tmp_path):
    args = shlex.split(command)[1:]
    args += [] if "--unlock" in args else ["-n"]
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=clone_like(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]


# Links: every relative link of README.md and docs/ resolves, a heading anchor included, and so does every page,
# config, benchmark or test the text names in backquotes.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
NAMED_FILE = re.compile(r"`((?:docs|config|benchmarks|tests)/[\w./-]+\.(?:md|yaml|py))`")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```$", "", markdown, flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(page: Path, text: str) -> list[str]:
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            broken.append(target)
    broken += [name for name in NAMED_FILE.findall(text) if not (ROOT / name).exists()]
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_every_link_resolves(page):
    path = ROOT / page
    assert not broken_links(path, path.read_text(encoding="utf-8"))


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading, with punctuation\n")
    text = "[a](there.md) [b](there.md#a-heading-with-punctuation) [c](gone.md) [d](there.md#gone) `docs/gone.md`"
    assert broken_links(page, text) == ["gone.md", "there.md#gone", "docs/gone.md"]
