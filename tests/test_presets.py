"""Presets: shipped ones load, round-trip through the user's dir, and every bad input is
one ConfigError that names the file, the key, the bad value and what was expected."""

from __future__ import annotations

import shutil

import pytest

from conftest import FIXTURES, user_preset
from engine import files, presets, runconfig
from engine.errors import ConfigError
from engine.preset_types import DevicePreset
from engine.schema import to_table

SHIPPED_DEVICES = {"cpu", "mps", "mps-safe", "mps-no-accum", "cuda", "auto"}


def load_fixture(home, name: str, kind: str = "devices"):
    shutil.copy(FIXTURES / "presets" / f"{name}.toml", home / f"{name}.toml")
    user_preset(home, kind, name, (FIXTURES / "presets" / f"{name}.toml").read_text())
    return presets.load_device(name) if kind == "devices" else presets.load_workload(name)


def test_shipped_presets_load_and_their_ladders_resolve(home):
    names = {r.name for r in presets.list_presets("devices")}
    assert SHIPPED_DEVICES <= names
    for name in names:
        preset = presets.load_device(name)
        ladder = presets.check_ladder(name, preset, name)
        assert list(ladder) == list(preset.fallback)
    assert presets.load_workload("matmul").params.n > 0


def test_field_note_configurations(home):
    cpu = presets.load_device("cpu")
    assert (cpu.batch_size, cpu.accumulation) == (8, 64)
    assert cpu.env["KMP_DUPLICATE_LIB_OK"] == "TRUE"
    assert presets.load_device("mps").effective_batch == 32 * 16
    safe = presets.load_device("mps-safe")
    assert (safe.batch_size, safe.accumulation, safe.precision, safe.empty_cache) == \
        (24, 4, "fp32", "before-mining")
    assert presets.load_device("mps-no-accum").accumulation == 1
    assert presets.load_device("cuda").precision == "bf16"
    assert presets.load_device("mps").fallback == ("mps-safe", "cpu")


def test_round_trip_through_user_dir_and_shadowing(home):
    original = presets.load_device("cpu")
    table = to_table(original) | {"batch_size": 12, "description": "mine"}
    path = presets.save_user_preset("devices", "cpu", table)
    assert path.parent.parent.parent == home / "config"
    ref = presets.find("devices", "cpu")
    assert not ref.shipped and ref.path == path
    assert [r for r in presets.list_presets("devices") if r.name == "cpu"][0].shadows_shipped
    loaded = presets.load_device("cpu")
    assert loaded == DevicePreset(**{**{f: getattr(original, f) for f in to_table(original)},
                                     "batch_size": 12, "description": "mine"})
    # the shipped file is untouched
    shipped = presets.device_from_table(files.read_toml(presets.paths.shipped_presets_dir()
                                                          / "devices" / "cpu.toml"), "shipped")
    assert shipped == original


def test_workload_round_trip(home):
    original = presets.load_workload("matmul")
    presets.save_user_preset("workloads", "mine", presets.workload_to_table(original))
    assert presets.load_workload("mine") == original


def test_good_fixture(home):
    preset = load_fixture(home, "good_device")
    assert preset.batch_size == 4 and preset.env == {"OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("fixture, key, words", [
    ("not_toml", None, "is not valid TOML"),
    ("extra_key", "batch_sise", "did you mean 'batch_size'"),
    ("wrong_type", "batch_size", "got 'big', expected a positive integer"),
    ("zero_batch", "batch_size", "got 0, expected a positive integer"),
    ("negative_accum", "accumulation", "got -2, expected a positive integer"),
    ("unknown_device", "device", "got 'tpu', expected one of 'auto', 'cpu', 'mps', 'cuda'"),
    ("mps_compile", "compile", "refused on MPS"),
    ("bool_as_int", "compile", "got 1, expected true or false"),
    ("rules_bad_kind", "rules.explode", "is not a crash kind; expected one of oom, backend"),
    ("rules_bad_action", "rules.oom", "got 'pray', expected one of 'next', 'retry'"),
    ("rules_user_code", "rules.user-code", "expected 'stop': falling back does not fix a bug"),
    ("bad_inject", "inject", "'native-crash' is not a fault; expected KIND@STEP[+]"),
])
def test_bad_device_presets_name_file_key_and_expectation(home, fixture, key, words):
    with pytest.raises(ConfigError) as err:
        load_fixture(home, fixture)
    line = err.value.line()
    assert f"{fixture}.toml" in line
    if key:
        assert f": {key}: " in line
    assert words in line


def test_bad_ladder_names_the_missing_preset(home):
    preset = load_fixture(home, "bad_ladder")
    with pytest.raises(ConfigError, match="fallback: 'no-such-preset': device preset 'no-such-preset'"):
        presets.check_ladder("bad_ladder", preset, "bad_ladder.toml")


def test_ladder_may_not_name_itself(home):
    user_preset(home, "devices", "loop", 'device = "cpu"\nfallback = ["loop"]\n')
    with pytest.raises(ConfigError, match="names 'loop' itself"):
        runconfig.resolve("matmul", "loop")


@pytest.mark.parametrize("fixture, key, words", [
    ("workload_bad_param", "params.n", "got 0, expected an integer >= 2"),
    ("workload_unknown", "workload", "got 'resnet', expected one of 'matmul'"),
    ("workload_train_typo", "train.epoch", "did you mean 'train.epochs'"),
])
def test_bad_workload_presets(home, fixture, key, words):
    with pytest.raises(ConfigError) as err:
        load_fixture(home, fixture, kind="workloads")
    assert f"{fixture}.toml: {key}: " in err.value.line() and words in err.value.line()


def test_missing_preset_lists_the_available_ones(home):
    with pytest.raises(ConfigError, match="device preset 'gpu'.*not found; available: auto, cpu"):
        presets.load_device("gpu")


def test_preset_names_cannot_escape_the_preset_dir(home):
    with pytest.raises(ConfigError, match="is not a preset name"):
        presets.load_device("../../etc/passwd")


def test_overrides_go_through_the_same_validation(home):
    config = runconfig.resolve("matmul", "cpu", ["batch_size=16", "train.epochs=2", "params.n=32",
                                                 "device.precision=bf16", "fallback=[]"])
    assert config.device.batch_size == 16 and config.device.precision == "bf16"
    assert config.workload.train.epochs == 2.0 and config.workload.params.n == 32
    assert config.ladder == {}

    for override, words in [
        ("batch_size=0", "--set: device.batch_size: got 0, expected a positive integer"),
        ("batch_sze=4", "--set: batch_sze: unknown key; did you mean 'device.batch_size'?"),
        ("device.batch_sze=4", "--set: device.batch_sze: unknown key; did you mean 'device.batch_size'?"),
        ("gpu.batch_size=4", "unknown section 'gpu'"),
        ("precision=fp8", "got 'fp8', expected one of 'auto', 'fp32', 'bf16', 'fp16'"),
        ("epochs=0", "--set: train.epochs: got 0, expected a number > 0"),
        ("batch_size", "expected key=value"),
        ("params.n=big", "params.n: got 'big', expected an integer >= 2"),
        ("fallback=[\"nope\"]", "'nope'"),
    ]:
        with pytest.raises(ConfigError) as err:
            runconfig.resolve("matmul", "cpu", [override])
        assert words in err.value.line(), (override, err.value.line())


def test_saving_validates_and_never_writes_a_bad_preset(home):
    with pytest.raises(ConfigError, match="batch_size"):
        presets.save_user_preset("devices", "broken", {"device": "cpu", "batch_size": -1})
    assert not (home / "config" / "presets" / "devices" / "broken.toml").exists()


def test_run_config_round_trips_through_run_toml(home):
    config = runconfig.resolve("matmul", "mps", ["batch_size=8"])
    again = runconfig.RunConfig.from_table(config.to_table(), "run.toml")
    assert again == config
    assert set(again.ladder) == {"mps-safe", "cpu"}


def test_a_list_of_strings_set_as_a_person_types_it():
    from engine.schema import parse_value

    strings = tuple[str, ...]
    assert parse_value("native-crash@40", strings) == ["native-crash@40"]
    assert parse_value("oom@10,native-crash@40", strings) == ["oom@10", "native-crash@40"]
    assert parse_value("[oom@10, native-crash@40]", strings) == ["oom@10", "native-crash@40"]
    assert parse_value('["native-crash@40"]', strings) == ["native-crash@40"]   # TOML, as before
    assert parse_value("native-crash@40", str) == "native-crash@40"
