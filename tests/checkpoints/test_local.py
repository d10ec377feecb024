"""A local run's step folders (checkpoints.local): a misnamed one is an error, not skipped; a live local run's
steps analysed with different extract settings, or with settings other than the config's, are a ConfigError
naming the steps, the key and the values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anisweep.checkpoints.local import LocalRun, check_live_settings, extract_names, resolve_live
from anisweep.errors import ConfigError

SETTINGS = {
    **{"n_sequences": 8, "seq_len": 32, "batch_size": 4, "sample_tokens": 64, "device": "cpu", "dtype": "float32"},
    **{"seed": 0, "attention": "auto", "qk_sample_tokens": 32, "score_bins": None, "threads": None},
}


def _live_step(run: Path, step: int, **settings) -> None:
    """A step folder as the callback writes it (empty tables: resolve_live only looks for the files)."""
    folder = run / f"step{step}"
    folder.mkdir(parents=True)
    for name in extract_names():
        (folder / name).write_text("")
    info = {"checkpoint": {"step": step, "seed": 0, "tokens_seen": None}, "settings": {**SETTINGS, **settings}}
    (folder / "extract.json").write_text(json.dumps(info))


def test_steps_analysed_with_another_seq_len_are_named_with_both_values(tmp_path):
    for step in (5, 10, 20):
        _live_step(tmp_path, step)
    _live_step(tmp_path, 30, seq_len=64, batch_size=2, device="cuda")  # batch_size, device: the same numbers
    with pytest.raises(ConfigError) as error:
        resolve_live("my-run", tmp_path, "all")
    message = str(error.value)
    assert "extract.seq_len" in message and "steps 5, 10, 20 with seq_len = 32" in message
    assert "step 30 with seq_len = 64" in message and "again with the same settings" in message
    assert [c.step for c in resolve_live("my-run", tmp_path, [5, 10, 20])] == [5, 10, 20]


@pytest.mark.parametrize(
    "key, value", [("seed", 1), ("sample_tokens", 128), ("dtype", "bfloat16"), ("score_bins", {"low": -5, "n": 4})]
)
def test_every_setting_that_changes_the_tables_is_compared(tmp_path, key, value):
    _live_step(tmp_path, 0)
    _live_step(tmp_path, 4, **{key: value})
    with pytest.raises(ConfigError, match=rf"different extract.{key}: step 0 .*; step 4 with {key} = "):
        resolve_live("my-run", tmp_path, "all")


def test_steps_analysed_with_settings_other_than_the_configs_are_named(tmp_path):
    for step in (0, 2):
        _live_step(tmp_path, step)
    assert len(resolve_live("my-run", tmp_path, "all", extract=SETTINGS)) == 2
    assert len(resolve_live("my-run", tmp_path, "all", extract={**SETTINGS, "batch_size": 1, "device": "auto"})) == 2
    with pytest.raises(ConfigError) as error:
        resolve_live("my-run", tmp_path, "all", extract={**SETTINGS, "seq_len": 64})
    message = str(error.value)
    assert "steps 0, 2 analysed with extract.seq_len = 32, but the config has extract.seq_len = 64" in message
    assert "set extract.seq_len: 32" in message and "ExtractSettings(seq_len=64)" in message
    entry = {"name": "my-run", "live": True, "path": str(tmp_path), "steps": "all"}
    with pytest.raises(ConfigError, match="extract.n_sequences = 8, but the config has extract.n_sequences = 64"):
        LocalRun.resolve_entry(entry, extract={**SETTINGS, "n_sequences": 64})
    checkpoints = resolve_live("my-run", tmp_path, "all")
    with pytest.raises(ConfigError, match="extract.seq_len"):  # as the config's checks call it
        check_live_settings(checkpoints, {**SETTINGS, "seq_len": 64})


@pytest.mark.parametrize("misnamed", ["step-20", "step_30", "Step40", "checkpoint_50"])
def test_a_misnamed_step_folder_is_an_error_not_skipped(tmp_path, misnamed):
    saved, live = tmp_path / "saved", tmp_path / "live"
    (saved / "step10").mkdir(parents=True)
    (saved / misnamed).mkdir()
    _live_step(live, 10)
    (live / misnamed).mkdir()
    number = misnamed.split("-")[-1].split("_")[-1].removeprefix("Step")
    expected = rf"folder {misnamed}/ is not named step\{{N\}}/.*rename it step{number}/"
    for resolve in (lambda: LocalRun.resolve("my-run", saved, "all"), lambda: resolve_live("my-run", live, "all")):
        with pytest.raises(ConfigError, match=expected):
            resolve()
    (live / misnamed).rmdir()
    (live / f"{misnamed}.log").write_text("")  # files and other folders are left alone
    (live / "runs").mkdir()
    assert [c.step for c in resolve_live("my-run", live, "all")] == [10]
