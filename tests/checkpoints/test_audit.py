"""The audit of a published grid (anisweep.checkpoints.audit), against a local Hub (tests/fakehub.py) serving
repositories under their real ids with a planted defect of each kind, and offline from the cache it leaves.

The weight files here are a few bytes each: the audit reads metadata only, so no model is needed (the workflow
test, tests/workflow/test_audit_sweep.py, sweeps tiny real models)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from fakehub import FakeHub, online_hub

from anisweep.checkpoints.audit import (
    AuditError,
    audit_model,
    expected_hashes,
    health,
    read_grid,
    write_grid,
)
from anisweep.checkpoints.hub import Pythia
from anisweep.checkpoints.weight_files import HashMismatch, check_hashes

from hubcache import offline_hub

REPO = "EleutherAI/pythia-70m"
CONFIG = {"config.json": b'{"model_type": "gpt_neox"}', "tokenizer.json": b"{}"}


def shards(tag: str, *, first: bytes | None = None) -> dict[str, bytes]:
    """A sharded checkpoint: two safetensors shards and their index (layer 0 in the first, layer 1 in the second)."""
    index = {
        "metadata": {"total_size": 0},
        "weight_map": {
            "gpt_neox.embed_in.weight": "model-00001-of-00002.safetensors",
            "gpt_neox.layers.0.attention.dense.weight": "model-00001-of-00002.safetensors",
            "gpt_neox.layers.1.attention.dense.weight": "model-00002-of-00002.safetensors",
            "embed_out.weight": "model-00002-of-00002.safetensors",
        },
    }
    return CONFIG | {
        "model-00001-of-00002.safetensors": first or f"{tag}-shard1".encode(),
        "model-00002-of-00002.safetensors": f"{tag}-shard2".encode(),
        "model.safetensors.index.json": json.dumps(index).encode(),
    }


def planted() -> dict[str, dict[str, bytes]]:
    """pythia-70m's grid with one defect of each kind; steps not named here are missing branches."""
    final = shards("final")
    return {
        "main": final,
        "step143000": final,
        "step0": final,  # the final model under the first step's name (EleutherAI/pythia#205)
        "step1": shards("one"),
        "step2": shards("two"),
        "step4": shards("one"),  # step1's weights again: no final step in the group
        "step1000": shards("k1", first=final["model-00001-of-00002.safetensors"]),  # the final first shard (#206)
        "step2000": CONFIG,  # a branch without weights (EleutherAI/pythia#202)
        "step3000": shards("k3"),
    }


def checkpoints(steps):
    return [Pythia.checkpoint("pythia-70m", s) for s in steps]


@pytest.fixture
def hub(monkeypatch, tmp_path):
    hub = FakeHub({REPO: planted()})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        yield hub


def by_step(table: pl.DataFrame) -> dict:
    return {r["step"]: r for r in table.filter(pl.col("step").is_not_null()).iter_rows(named=True)}


def test_every_planted_defect_is_found_from_metadata_alone(hub):
    table, notes = audit_model(checkpoints([0, 1000, 143000]))
    rows = by_step(table)
    assert notes == []
    assert len(rows) == len(Pythia.steps)  # the whole published grid, not only the swept steps
    assert (rows[0]["status"], rows[0]["repeats"], rows[0]["repeats_step"]) == ("duplicate", "step143000", 143000)
    assert rows[143000]["status"] == "ok"  # the final model is trusted, and so is main
    assert table.filter(pl.col("revision") == "main")["status"].to_list() == ["ok"]
    # two branches with the same weights and no trusted one among them: both flagged, each against the latest other
    assert (rows[1]["status"], rows[1]["repeats"]) == ("duplicate", "step4")
    assert (rows[4]["status"], rows[4]["repeats"]) == ("duplicate", "step1")
    partial = rows[1000]
    assert partial["status"] == "partial"
    assert partial["shared_files"] == ["model-00001-of-00002.safetensors"]
    assert partial["shared_with"] == ["main", "step0", "step143000"]  # step0 serves the final model whole
    assert partial["shared_tensors"] == ["gpt_neox.embed_in.weight", "gpt_neox.layers.0.attention.dense.weight"]
    assert partial["shared_layers"] == [0]
    assert rows[2000]["status"] == "no_weights" and rows[2000]["nearest"] == [1000, 3000]
    assert rows[5000]["status"] == "missing" and rows[5000]["nearest"] == [3000, 143000]
    assert rows[2]["status"] == rows[3000]["status"] == "ok"
    # nothing but metadata and the shard indexes (one blob: the branches' indexes are byte for byte the same)
    assert [d.rsplit("/", 1)[1] for d in hub.downloads()] == ["model.safetensors.index.json"]
    assert partial["indexed_files"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_health_names_each_defect_in_a_few_lines(hub):
    table, notes = audit_model(checkpoints([0, 1000]))
    lines = health(table, notes, steps=[0, 1000])
    text = "\n".join(lines)
    assert len(lines) <= 10, text
    assert "repeat step143000: steps 0" in text
    assert "partial: step1000: model-00001-of-00002.safetensors (2 tensors, layers 0) also served by main" in text
    assert "no_weights: step2000" in text and "missing:" in text
    assert "swept and flagged: steps 0, 1000" in text


def test_a_branch_pushed_again_is_listed_again_and_only_it(hub, tmp_path):
    table, _ = audit_model(checkpoints([1000, 3000]))
    path = tmp_path / "grid.parquet"
    assert write_grid(table, path) and not write_grid(table, path)  # the same table is not written twice
    hub.push(REPO, "step3000", shards("k3-fixed"))
    hub.requests.clear()
    again, _ = audit_model(checkpoints([1000, 3000]), previous=read_grid(path))
    trees = [p for m, p in hub.requests if "/tree/" in p]
    assert trees == [f"/api/models/{REPO}/tree/{hub.commits[REPO]['step3000']}"]
    old, new = by_step(table)[3000], by_step(again)[3000]
    assert old["files_sha256"] != new["files_sha256"] and old["commit"] != new["commit"]
    assert write_grid(again, path)


def test_offline_it_checks_what_the_cache_holds_and_says_so(hub, monkeypatch, tmp_path):
    from huggingface_hub import snapshot_download

    for branch in ("step0", "step143000"):
        snapshot_download(REPO, revision=branch)
    offline_hub(monkeypatch, tmp_path / "hf")
    table, notes = audit_model(checkpoints([0, 143000]))
    rows = by_step(table)
    assert rows[0]["status"] == "duplicate" and rows[0]["source"] == "cache"
    assert rows[1000]["status"] == "unchecked"
    assert any("HF_HUB_OFFLINE" in n for n in notes) and any("not in the cache" in n for n in notes)


def test_with_nothing_known_every_step_is_unchecked(monkeypatch, tmp_path):
    offline_hub(monkeypatch, tmp_path / "empty")
    table, notes = audit_model(checkpoints([0]))
    assert set(table["status"]) == {"unchecked"}
    assert any("could not be checked" in n for n in notes)


def test_hashes_that_differ_from_the_audit_name_the_file(hub):
    table, _ = audit_model(checkpoints([3000]))
    expected = expected_hashes(table, 3000)
    assert sorted(expected) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    check_hashes(dict(expected), expected, "pythia/pythia-70m/step3000", "sha256")
    wrong = dict(expected) | {"model-00002-of-00002.safetensors": "0" * 64}
    with pytest.raises(HashMismatch, match=r"step3000: model-00002-of-00002\.safetensors \(sha256 000000000000"):
        check_hashes(wrong, expected, "pythia/pythia-70m/step3000", "sha256")


def test_audit_error_is_a_runtime_error():
    assert issubclass(AuditError, RuntimeError)


def test_the_audit_command_prints_the_health_and_keeps_the_table(hub, tmp_path, capsys):
    from anisweep.cli import main

    assert main(["audit", "pythia", "pythia-70m", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "pythia/pythia-70m: 154 published steps" in out and "repeat step143000: steps 0" in out
    assert "grid.parquet: written" in out
    table = read_grid(tmp_path / "results" / "pythia" / "pythia-70m" / "grid.parquet")
    assert by_step(table)[0]["status"] == "duplicate"
    assert main(["audit", "pythia", "pythia-70m", "--results", str(tmp_path / "results")]) == 0
    assert "grid.parquet: unchanged" in capsys.readouterr().out


def test_the_sweep_lists_the_steps_the_audit_left_out(hub, tmp_path):
    from anisweep.cli import main
    from anisweep.tables import METRIC_SCHEMA, write_atomic

    table, _ = audit_model(checkpoints([0, 1000, 3000]))
    grid = tmp_path / "grid.parquet"
    write_grid(table, grid)
    metrics = []
    for step in (1000, 3000):
        row = {k: None for k in METRIC_SCHEMA} | {"family": "pythia", "model": "pythia-70m", "seed": 1234}
        row |= {"step": step, "layer": 0, "site": "resid", "metric": "avg_cos", "value": 0.5}
        path = tmp_path / f"step{step}" / "metrics.parquet"
        path.parent.mkdir()
        write_atomic(pl.DataFrame([row], schema=METRIC_SCHEMA), path)
        metrics.append(str(path))
    out = tmp_path / "sweep.parquet"
    args = ["sweep", "--out", str(out), "--expected-steps", "1000,3000", "--audit", str(grid)]
    assert main([*args, "--flagged-steps", "0", "--seed", "1234", *metrics]) == 0
    sweep = {r["step"]: r for r in pl.read_parquet(out).iter_rows(named=True)}
    zero = sweep[0]
    assert (zero["status"], zero["repeats"], zero["duplicate_of_step"]) == ("duplicate", "step143000", 143000)
    assert sweep[0]["seed"] == 1234
    assert (sweep[1000]["status"], sweep[1000]["audit"]) == ("ok", "partial")
    assert "step143000" in sweep[1000]["repeats"]
    assert (sweep[3000]["audit"], sweep[3000]["repeats"]) == ("ok", None)


def test_fetch_checks_the_hubs_sha256_against_the_audit(hub, tmp_path):
    from anisweep.checkpoints.fetch import fetch

    table, _ = audit_model(checkpoints([3000]))
    expected = expected_hashes(table, 3000)
    manifest = fetch(checkpoints([3000])[0], tmp_path / "ok", audited_sha256=expected)
    assert manifest["audited_sha256"] == expected
    wrong = expected | {"model-00001-of-00002.safetensors": "f" * 64}
    with pytest.raises(HashMismatch, match=r"pythia/pythia-70m/step3000: model-00001-of-00002\.safetensors"):
        fetch(checkpoints([3000])[0], tmp_path / "wrong", audited_sha256=wrong)


def test_extract_refuses_bytes_the_hub_named_otherwise(hub, tmp_path):
    from anisweep.checkpoints.fetch import fetch
    from anisweep.checkpoints.weight_files import WeightFiles

    manifest = fetch(checkpoints([3000])[0], tmp_path / "dest", keep_weights=True)
    WeightFiles.read(manifest["path"])  # the bytes are those the Hub named
    shard = next(p for p in Path(manifest["path"]).iterdir() if p.name.startswith("model-00002"))
    target = shard.resolve()
    target.chmod(0o644)
    target.write_bytes(b"corrupted")
    with pytest.raises(HashMismatch, match=r"model-00002-of-00002\.safetensors \(read "):
        WeightFiles.read(manifest["path"])


def test_a_step_serving_main_outside_the_sweep_is_flagged_against_main(monkeypatch, tmp_path):
    """pythia-2.8b: `main` and step143000 differ, and early steps serve `main`'s file (EleutherAI/pythia#205)."""
    hub = FakeHub({REPO: {"main": shards("main"), "step143000": shards("final"), "step1000": shards("main")}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        table, _ = audit_model(checkpoints([1000, 143000]))
    rows = by_step(table)
    assert (rows[1000]["status"], rows[1000]["repeats"], rows[1000]["repeats_step"]) == ("duplicate", "main", None)
    assert rows[143000]["status"] == "ok"


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_pythia_2_8b_published_pattern_leaves_85_of_154_steps_out(monkeypatch, tmp_path):
    """EleutherAI/pythia#205's table, with tiny files: 76 steps serve `main`'s file, 10 (143000 among them) a second
    one; the rest their own. The audit flags 85 steps, each against the trusted branch it repeats, in two lines."""
    early = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, *range(1000, 53001, 1000)]
    early += [55000, 60000, 65000, 70000, 80000, 90000, 100000, 103000, 110000, 120000, 130000, 140000]
    late = [54000, 56000, 57000, 58000, 59000, 61000, 62000, 63000, 64000, 143000]
    main, final = shards("main"), shards("final")
    grid = {f"step{s}": main if s in early else final if s in late else shards(str(s)) for s in Pythia.steps}
    hub = FakeHub({REPO: grid | {"main": main}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        table, notes = audit_model(checkpoints(Pythia.steps))
    rows = by_step(table)
    assert len(early) == 76 and len(late) == 10
    assert sorted(s for s, r in rows.items() if r["repeats"] == "main") == sorted(early)
    assert sorted(s for s, r in rows.items() if r["repeats"] == "step143000") == late[:-1]
    assert sum(r["status"] == "ok" for r in rows.values()) == 154 - 85
    lines = health(table, notes)
    assert lines[0] == "pythia/pythia-70m: 154 published steps: 85 duplicate, 69 ok (and 1 other branch: main)"
    assert len(lines) == 4


def test_offline_the_caches_refs_come_before_the_previous_audits(hub, monkeypatch, tmp_path):
    from huggingface_hub import snapshot_download

    table, _ = audit_model(checkpoints([3000]))
    hub.push(REPO, "step3000", shards("k3-again"))
    snapshot_download(REPO, revision="step3000")  # the cache now holds the branch's new commit
    offline_hub(monkeypatch, tmp_path / "hf")
    again, _ = audit_model(checkpoints([3000]), previous=table)
    assert by_step(again)[3000]["commit"] == hub.commits[REPO]["step3000"] != by_step(table)[3000]["commit"]
    assert by_step(again)[3000]["status"] == "ok" and by_step(again)[3000]["source"] == "cache"
    assert by_step(again)[1000]["status"] == "partial"  # known from the previous audit, not in the cache


def test_the_plan_of_a_run_skips_or_keeps_the_flagged_steps(hub, tmp_path):
    import io

    from anisweep.checkpoints.sweep_audit import plan

    chosen = checkpoints([0, 1000, 2000, 3000])
    out = io.StringIO()
    skip = plan(chosen, {"flagged": "skip"}, tmp_path / "results", stderr=out)
    assert sorted(skip.skipped) == ["pythia/pythia-70m/step0", "pythia/pythia-70m/step2000"]
    assert skip.flagged_steps("pythia", "pythia-70m") == [0, 2000]
    assert sorted(skip.hashes) == ["pythia/pythia-70m/step1000", "pythia/pythia-70m/step3000"]  # checked at fetch
    assert "audit: pythia/pythia-70m: 154 published steps" in out.getvalue()
    grid = tmp_path / "results" / "pythia" / "pythia-70m" / "grid.parquet"
    assert not (tmp_path / "results").exists()  # reading the config writes nothing: a dry run changes no results
    assert skip.write_grids() == [grid] and grid.is_file()  # when the run starts
    assert skip.write_grids() == []  # unchanged: left as it was
    keep = plan(chosen, {"flagged": "keep"}, tmp_path / "results", stderr=io.StringIO())
    assert keep.skipped == {} and "pythia/pythia-70m/step0" in keep.hashes
    assert plan(chosen, {"enabled": False}, tmp_path / "other").grids == {}
    with pytest.raises(AuditError, match=r"pythia/pythia-70m: every step of the config is flagged .*0: duplicate"):
        plan(checkpoints([0]), {"flagged": "skip"}, tmp_path / "results", stderr=io.StringIO())


def test_a_job_reads_the_runs_table_and_asks_the_hub_nothing(hub, tmp_path):
    import io

    from anisweep.checkpoints.sweep_audit import plan

    plan(checkpoints([0, 1000]), {}, tmp_path / "results", stderr=io.StringIO()).write_grids()
    hub.requests.clear()
    again = plan(checkpoints([0, 1000]), {}, tmp_path / "results", stderr=io.StringIO(), refresh=False)
    assert hub.requests == [] and sorted(again.skipped) == ["pythia/pythia-70m/step0"]


def test_the_sweeps_param_follows_what_it_reads_of_the_audit(hub, tmp_path):
    """The verdict (the sweep's recorded param) changes with a swept step's status or the branch it repeats, never
    with what the sweep does not read (another step's row, a commit that moved with the same weights)."""
    import io

    from anisweep.checkpoints.sweep_audit import plan

    audit = plan(checkpoints([0, 1000, 3000]), {}, tmp_path / "results", stderr=io.StringIO())
    verdict = audit.verdict("pythia", "pythia-70m")
    assert len(verdict) == 64 and audit.verdict("toy", "toy-neox") == ""
    table = audit.tables[("pythia", "pythia-70m")]
    other = table.with_columns(
        commit=pl.when(pl.col("step") == 3000).then(pl.lit("0" * 40)).otherwise("commit"),
        status=pl.when(pl.col("step") == 2000).then(pl.lit("ok")).otherwise("status"),  # no step of the config
    )
    audit.tables[("pythia", "pythia-70m")] = other
    assert audit.verdict("pythia", "pythia-70m") == verdict
    audit.tables[("pythia", "pythia-70m")] = table.with_columns(
        repeats=pl.when(pl.col("step") == 0).then(pl.lit("main")).otherwise("repeats")
    )
    assert audit.verdict("pythia", "pythia-70m") != verdict


def test_the_audit_command_with_nothing_to_audit_is_an_error(monkeypatch, tmp_path, capsys):
    from anisweep.cli import main

    offline_hub(monkeypatch, tmp_path / "empty")
    assert main(["audit", "pythia", "pythia-70m", "--results", str(tmp_path / "results")]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("AuditError: pythia/pythia-70m: nothing of its grid could be audited (HF_HUB_OFFLINE is set")
    assert not (tmp_path / "results").exists()


# ---------------------------------------------------------------------------------------------- incomplete branches


def indexed_shards(tag: str, names: list[str], index: str, *, held: int) -> dict[str, bytes]:
    """A sharded checkpoint whose index names every file of ``names`` and whose branch holds the first ``held``."""
    weight_map = {f"gpt_neox.layers.{i}.attention.dense.weight": name for i, name in enumerate(names)}
    files = {index: json.dumps({"metadata": {}, "weight_map": weight_map}).encode()} if index else {}
    return CONFIG | files | {name: f"{tag}-{name}".encode() for name in names[:held]}


SAFETENSORS_SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
BIN_SHARDS = [
    "pytorch_model-00001-of-00003.bin",
    "pytorch_model-00002-of-00003.bin",
    "pytorch_model-00003-of-00003.bin",
]
INCOMPLETE = {  # the branch, what the audit names absent, and how it knows
    "safetensors index": (
        indexed_shards("k3", SAFETENSORS_SHARDS, "model.safetensors.index.json", held=1),
        ["model-00002-of-00002.safetensors"],
        "its shard index model.safetensors.index.json names model-00002-of-00002.safetensors",
    ),
    "bin index (pythia-12b)": (
        indexed_shards("k3", BIN_SHARDS, "pytorch_model.bin.index.json", held=2),
        ["pytorch_model-00003-of-00003.bin"],
        "its shard index pytorch_model.bin.index.json names pytorch_model-00003-of-00003.bin",
    ),
    "index alone tells": (
        indexed_shards("k3", ["part-a.safetensors", "part-b.safetensors"], "model.safetensors.index.json", held=1),
        ["part-b.safetensors"],
        "its shard index model.safetensors.index.json names part-b.safetensors",
    ),
    "names alone tell": (
        indexed_shards("k3", BIN_SHARDS, "", held=1),
        ["pytorch_model-00002-of-00003.bin", "pytorch_model-00003-of-00003.bin"],
        "its shards' names announce pytorch_model-00002-of-00003.bin, pytorch_model-00003-of-00003.bin",
    ),
}


@pytest.fixture
def incomplete_hub(request, monkeypatch, tmp_path):
    """pythia-70m with step3000 holding fewer weight files than it names (EleutherAI/pythia#206's repository)."""
    branch = INCOMPLETE[request.param][0]
    hub = FakeHub(
        {REPO: {"main": shards("final"), "step143000": shards("final"), "step1000": shards("k1"), "step3000": branch}}
    )
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        yield hub, *INCOMPLETE[request.param][1:]


@pytest.mark.parametrize("incomplete_hub", list(INCOMPLETE), indirect=True)
def test_a_branch_without_a_shard_it_names_is_incomplete(incomplete_hub):
    hub, absent, named = incomplete_hub
    table, _ = audit_model(checkpoints([1000, 3000, 143000]))
    row = by_step(table)[3000]
    assert (row["status"], row["absent_files"], row["weights_id"]) == ("incomplete", absent, None)
    assert row["note"] == (
        f"step3000: {named}, which the branch does not hold: it cannot be loaded; nearest steps with weights: "
        "1000, 143000"
    )
    assert row["nearest"] == [1000, 143000] and by_step(table)[1000]["status"] == "ok"
    assert f"  incomplete: {row['note']}" in health(table)
    assert not any(d.endswith((".safetensors", ".bin")) for d in hub.downloads())  # before any weight moved


@pytest.mark.parametrize("incomplete_hub", ["safetensors index"], indirect=True)
def test_an_incomplete_step_is_never_fetched_and_the_sweep_lists_it(incomplete_hub, tmp_path):
    import io

    from anisweep.checkpoints.audit import skipped_rows
    from anisweep.checkpoints.fetch import FetchError, fetch
    from anisweep.checkpoints.sweep_audit import plan

    hub, _, _ = incomplete_hub
    chosen = checkpoints([1000, 3000])
    out = io.StringIO()
    run = plan(chosen, {"flagged": "skip"}, tmp_path / "results", stderr=out)
    assert run.flagged_steps("pythia", "pythia-70m") == [3000] and "pythia/pythia-70m/step3000" not in run.hashes
    assert "swept and flagged: steps 3000" in out.getvalue()
    grid = run.tables[("pythia", "pythia-70m")]
    rows = skipped_rows(grid, [3000], 1234).to_dicts()
    assert [(r["step"], r["status"], r["audit"]) for r in rows] == [(3000, "incomplete", "incomplete")]
    # with the audit off (or under flagged: keep), fetch stops on the shard index, before any weight moves
    hub.requests.clear()
    with pytest.raises(FetchError, match=r"step3000: .*names model-00002-of-00002\.safetensors, which the branch"):
        fetch(chosen[1], tmp_path / "dest")
    assert not any(d.endswith(".safetensors") for d in hub.downloads()), hub.downloads()


@pytest.mark.parametrize("incomplete_hub", ["bin index (pythia-12b)", "names alone tell"], indirect=True)
def test_the_weights_job_names_the_absent_shards(incomplete_hub):
    from anisweep.weights.remote import hub_source
    from anisweep.weights.source import WeightsError

    hub, absent, named = incomplete_hub
    with pytest.raises(WeightsError, match=rf"step3000: .*{re.escape(named)}, which the branch does not hold"):
        hub_source(checkpoints([3000])[0])
    assert not any(d.endswith(".bin") for d in hub.downloads())


def test_fetch_without_the_index_stops_on_the_shards_names(monkeypatch, tmp_path):
    from anisweep.checkpoints.fetch import FetchError, fetch

    hub = FakeHub({REPO: {"step3000": indexed_shards("k3", BIN_SHARDS, "", held=1)}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        with pytest.raises(FetchError, match=r"shards' names announce pytorch_model-00002-of-00003\.bin, pytorch"):
            fetch(checkpoints([3000])[0], tmp_path / "dest")
        assert hub.downloads() == []


# ---------------------------------------------------------------------------------------------- reasons


def test_unchecked_steps_are_named_with_their_reason(monkeypatch, tmp_path):
    """The Hub lists no sha256 for weight files kept outside LFS: the health names the steps and why, and the run's
    error says what is true online (no network advice)."""
    import io

    import fakehub

    from anisweep.checkpoints.sweep_audit import plan

    monkeypatch.setattr(fakehub, "LFS_SUFFIXES", (".h5",))  # the weights as plain git files
    hub = FakeHub({REPO: {"main": shards("final"), "step143000": shards("final"), "step1000": shards("k1")}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        table, _ = audit_model(checkpoints([1000, 143000]))
        assert "  unchecked: steps 1000, 143000: weight files without an LFS sha256" in health(table)
        with pytest.raises(AuditError) as error:
            plan(checkpoints([1000, 143000]), {}, tmp_path / "results", stderr=io.StringIO())
    message = str(error.value)
    assert "steps 1000, 143000: weight files without an LFS sha256" in message
    assert "the Hub lists no sha256 for their weight files" in message and "audit.allow_unaudited: true" in message
    assert "network" not in message and "HF_HUB_OFFLINE" not in message


def test_offline_the_run_says_so_and_names_the_steps(monkeypatch, tmp_path):
    import io

    from anisweep.checkpoints.sweep_audit import plan

    offline_hub(monkeypatch, tmp_path / "empty")
    with pytest.raises(AuditError) as error:
        plan(checkpoints([0, 1000]), {}, tmp_path / "results", stderr=io.StringIO())
    message = str(error.value)
    assert "steps 0, 1000: nothing known of EleutherAI/pythia-70m (not in the cache)" in message
    assert "HF_HUB_OFFLINE is set: unset it" in message and "could not be reached" not in message


def test_with_the_hub_unreachable_the_run_says_so(monkeypatch, tmp_path):
    import io

    from anisweep.checkpoints.sweep_audit import plan

    online_hub(monkeypatch, tmp_path / "empty", "http://127.0.0.1:9")
    with pytest.raises(AuditError) as error:
        plan(checkpoints([0]), {}, tmp_path / "results", stderr=io.StringIO())
    message = str(error.value)
    assert "the Hub could not be reached: check the network" in message and "HF_HUB_OFFLINE" not in message


# ---------------------------------------------------------------------------------------------- a `hub` model


TINY = "me/tiny-neox"


@pytest.fixture
def tiny_hub(monkeypatch, tmp_path):
    single = {"model.safetensors": b"w"}
    hub = FakeHub({TINY: {"step0": CONFIG | single, "step1": CONFIG | {"model.safetensors": b"v"}}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        yield hub


def test_the_audit_command_writes_a_hub_grid_where_the_workflow_reads_it(tiny_hub, tmp_path, capsys):
    import io

    import yaml

    from anisweep.checkpoints.catalogue import resolve
    from anisweep.checkpoints.sweep_audit import plan
    from anisweep.cli import main

    entry = {"family": "hub", "name": TINY, "revision": "step{step}", "steps": "all"}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"models": [entry]}))
    results = tmp_path / "results"
    assert main(["audit", "hub", TINY, "--config", str(config), "--results", str(results)]) == 0
    assert "grid.parquet: written" in capsys.readouterr().out
    workflow = plan(resolve(entry), {}, results, stderr=io.StringIO()).grids[("hub", "me--tiny-neox")]
    assert workflow == results / "hub" / "me--tiny-neox" / "grid.parquet" and workflow.is_file()
    assert not (results / "hub" / "me").exists()


def test_the_audit_command_of_a_hub_model_without_its_entry_says_what_to_give(tiny_hub, tmp_path, capsys):
    from anisweep.cli import main

    assert main(["audit", "hub", TINY, "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "give --config CONFIG" in err and 'revision: "step{step}"' in err
    assert tiny_hub.requests == [] and not (tmp_path / "results").exists()
