"""The .properties parser, the typed loader, precedence and every error message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from angelconf.config import (
    ConfigError,
    Key,
    KeyIndex,
    at_least,
    between,
    in_range,
    interval,
    load_config,
    positive,
    validate,
)
from angelconf.properties import parse_properties
from angelconf.render import render_markdown

KEYS = [
    Key("ml.learn.rate", "float", 0.5, "Initial step size.", positive),
    Key("ml.epoch.num", "int", 30, "Epochs.", positive),
    Key("ml.opt.decay.on.batch", "bool", False, "Decay per batch."),
    Key(
        "ml.opt.decay.class.name",
        "str",
        "StandardDecay",
        "Schedule.",
        choices=("StandardDecay", "WarmRestarts", "ConstantLearningRate"),
    ),
    Key("ml.opt.decay.milestones", "int_list", None, "Milestones."),
    Key("ml.data.validate.ratio", "float", 0.05, "Validation share.", between(0, 1)),
    Key("angel.train.data.path", "str", None, "Training data."),
    Key("ml.opt.decay.<i>.gamma", "float", None, "Child gamma.", positive),
]


def entries(text: str) -> dict[str, str]:
    return {e.key: e.value for e in parse_properties(text)}


def test_separators_and_comments() -> None:
    text = "# comment\n! also a comment\n  a=1\nb : 2\nc 3\nd\t=\t4\ne=\nf\n  \n"
    assert entries(text) == {"a": "1", "b": "2", "c": "3", "d": "4", "e": "", "f": ""}


def test_continuations_keep_no_leading_whitespace() -> None:
    text = "k = one, \\\n      two, \\\n      three\nnext=1\n"
    assert entries(text) == {"k": "one, two, three", "next": "1"}


def test_even_backslashes_do_not_continue() -> None:
    assert entries("k=a\\\\\nj=b\n") == {"k": "a\\", "j": "b"}


def test_trailing_continuation_at_end_of_file() -> None:
    assert entries("k=a\\") == {"k": "a"}


def test_escapes() -> None:
    text = "uni=caf\\u00e9\ntab=a\\tb\nkey\\ with\\ space=v\\=w\ncolon\\:key=x\\:y\nnl=a\\nb\n"
    assert entries(text) == {
        "uni": "café",
        "tab": "a\tb",
        "key with space": "v=w",
        "colon:key": "x:y",
        "nl": "a\nb",
    }


def test_separator_then_value_starting_with_separator() -> None:
    assert entries("k = = v\nj : :w\n") == {"k": "= v", "j": ":w"}


def test_bad_unicode_escape_names_line() -> None:
    with pytest.raises(ConfigError, match=r"f.properties:2: malformed \\uXXXX escape"):
        parse_properties("a=1\nb=\\u12G4\n", "f.properties")


def test_line_numbers_point_at_the_key(tmp_path: Path) -> None:
    f = tmp_path / "job.properties"
    f.write_text("# head\nml.epoch.num = \\\n   7\nml.learn.rate=0.1\n")
    conf = load_config(f, [], KEYS)
    assert conf["ml.epoch.num"] == 7
    assert conf.source("ml.epoch.num") == f"{f}:2"
    assert conf.source("ml.learn.rate") == f"{f}:4"


def test_precedence_default_file_command_line(tmp_path: Path) -> None:
    f = tmp_path / "job.properties"
    f.write_text("ml.learn.rate=0.1\nml.epoch.num=6\n")
    conf = load_config(f, ["ml.learn.rate=0.2"], KEYS)
    assert conf["ml.learn.rate"] == 0.2 and conf.source("ml.learn.rate") == "command line"
    assert conf["ml.epoch.num"] == 6 and conf.source("ml.epoch.num") == f"{f}:2"
    assert (
        conf["ml.data.validate.ratio"] == 0.05
        and conf.source("ml.data.validate.ratio") == "default"
    )
    assert not conf.is_set("ml.data.validate.ratio") and conf.is_set("ml.epoch.num")
    # The last --set wins too.
    conf = load_config(f, ["ml.epoch.num=1", "ml.epoch.num=2"], KEYS)
    assert conf["ml.epoch.num"] == 2


def test_an_empty_value_is_unset_where_unset_is_nothing(tmp_path: Path) -> None:
    f = tmp_path / "job.properties"
    f.write_text("angel.train.data.path=\nml.opt.decay.milestones =\n")
    conf = load_config(f, [], KEYS)
    assert conf["angel.train.data.path"] is None
    assert conf["ml.opt.decay.milestones"] is None


@pytest.mark.parametrize(
    ("line", "default"),
    [
        ("ml.epoch.num=", "30"),
        ("ml.learn.rate =", "0.5"),
        ("ml.opt.decay.class.name", "StandardDecay"),
        ("ml.opt.decay.on.batch:", "false"),
    ],
)
def test_an_empty_value_of_a_key_with_a_default_is_refused(
    tmp_path: Path, line: str, default: str
) -> None:
    """It trained at the default before, silently: a value lost is likelier than one meant."""
    f = tmp_path / "job.properties"
    f.write_text(f"# a job\n{line}\n")
    key = re.split(r"[=: ]", line)[0]
    with pytest.raises(ConfigError) as e:
        load_config(f, [], KEYS)
    assert str(e.value) == (
        f"{f}:2: {key} has no value; give one, or remove the line to use the default ({default})"
    )


def test_types() -> None:
    conf = load_config(
        None,
        [
            "ml.opt.decay.on.batch=TRUE",
            "ml.opt.decay.milestones=3, 6,9",
            "ml.epoch.num=1e1",
            "ml.opt.decay.class.name=warmrestarts",
            "ml.opt.decay.2.gamma=0.5",
        ],
        KEYS,
    )
    assert conf["ml.opt.decay.on.batch"] is True
    assert conf["ml.opt.decay.milestones"] == [3, 6, 9]
    assert conf["ml.epoch.num"] == 10
    assert conf["ml.opt.decay.class.name"] == "WarmRestarts"  # declared spelling
    assert conf["ml.opt.decay.2.gamma"] == 0.5


def test_mapping_overrides_are_typed() -> None:
    conf = load_config(None, {"ml.learn.rate": 0.3, "ml.epoch.num": "4"}, KEYS)
    assert conf["ml.learn.rate"] == 0.3 and conf["ml.epoch.num"] == 4
    assert conf.source("ml.learn.rate") == "program"
    again = conf.with_overrides({"ml.epoch.num": 9})
    assert again["ml.epoch.num"] == 9 and conf["ml.epoch.num"] == 4


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["ml.lern.rate=0.1"],
            r"^command line: unknown key ml.lern.rate \(did you mean ml.learn.rate\?\)",
        ),
        (
            ["ml.epoch.num=ten"],
            r"^command line: ml.epoch.num=ten is not valid: expected an integer$",
        ),
        (
            ["ml.epoch.num=2.5"],
            r"^command line: ml.epoch.num=2.5 is not valid: expected an integer$",
        ),
        (
            ["ml.learn.rate=-1"],
            r"^command line: ml.learn.rate=-1 is not valid: expected a number > 0$",
        ),
        (
            ["ml.learn.rate=nan"],
            r"^command line: ml.learn.rate=nan is not valid: expected a finite number$",
        ),
        (
            ["ml.learn.rate=inf"],
            r"^command line: ml.learn.rate=inf is not valid: expected a finite number$",
        ),
        (["ml.opt.decay.on.batch=maybe"], r"expected true or false$"),
        (["ml.data.validate.ratio=1.5"], r"expected a number in \[0, 1\]$"),
        (["ml.opt.decay.milestones=1,x"], r"expected a comma-separated list of integers$"),
        (
            ["ml.opt.decay.class.name=StandardDecy"],
            r"expected one of StandardDecay, WarmRestarts, ConstantLearningRate "
            r"\(did you mean StandardDecay\?\)$",
        ),
        (["ml.opt.decay.1.gamma=0"], r"ml.opt.decay.1.gamma=0 is not valid: expected a number > 0"),
        (["ml.opt.decay.1.gama=0.1"], r"did you mean ml.opt.decay.1.gamma\b"),
        (["novalue"], r"^--set 'novalue': expected key=value$"),
        (["=3"], r"^--set '=3': the key is empty"),
    ],
)
def test_errors_on_the_command_line(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets, KEYS)


def test_error_in_file_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.properties"
    f.write_text("ml.learn.rate=0.1\n\nml.epoch.nmu=3\n")
    with pytest.raises(
        ConfigError, match=rf"^{f}:3: unknown key ml.epoch.nmu \(did you mean ml.epoch.num\?\)"
    ):
        load_config(f, [], KEYS)
    f.write_text("# x\nml.epoch.num = -2\n")
    with pytest.raises(
        ConfigError, match=rf"^{f}:2: ml.epoch.num=-2 is not valid: expected a number > 0$"
    ):
        load_config(f, [], KEYS)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"configuration file .*nope.properties does not exist"):
        load_config(tmp_path / "nope.properties", [], KEYS)
    with pytest.raises(ConfigError, match=r"is a directory, not a .properties file"):
        load_config(tmp_path, [], KEYS)


def test_duplicate_declaration_is_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        load_config(None, [], [*KEYS, Key("ml.epoch.num", "int", 1, "again")])


def test_bad_type_in_declaration() -> None:
    with pytest.raises(ValueError, match="type 'double' is not one of"):
        Key("x", "double", 1.0, "x")


def test_latin1_file(tmp_path: Path) -> None:
    f = tmp_path / "l1.properties"
    f.write_bytes("angel.train.data.path=caf\xe9\n".encode("latin-1"))
    assert load_config(f, [], KEYS)["angel.train.data.path"] == "café"


def test_markdown_lists_every_key() -> None:
    md = render_markdown([("test", KEYS)])
    for k in KEYS:
        assert f"`{k.name}`" in md
    assert "| `ml.learn.rate` | float | `0.5` | Initial step size. |" in md


def test_interval_checks_name_their_interval() -> None:
    assert between(0, 1)(1) is None and between(0, 1)(1.5) == "a number in [0, 1]"
    assert in_range(0, 1)(0) == "a number in (0, 1)" and in_range(0, 1)(0.5) is None
    half = interval(0, 1, high_open=True)
    assert half(0) is None and half(1) == "a number in [0, 1)"
    assert interval(0, 1, low_open=True)(1) is None
    assert at_least(1)(0) == "a number >= 1"
    assert (
        at_least(1, "an integer")(0) == "an integer >= 1" and at_least(1, "an integer")(1) is None
    )


def test_validate_converts_checks_and_names_the_concrete_key() -> None:
    gamma = Key("ml.opt.decay.<i>.gamma", "float", None, "Child gamma.", positive)
    assert validate(gamma, "0.5") == 0.5 and validate(gamma, None) is None
    with pytest.raises(
        ConfigError, match=r"^ml.opt.decay.2.gamma=0 is not valid: expected a number > 0$"
    ):
        validate(gamma, 0, "ml.opt.decay.2.gamma")
    with pytest.raises(ConfigError, match=r"^ml.epoch.num=x is not valid: expected an integer$"):
        validate(KEYS[1], "x")


def test_key_index_finds_indexed_names_and_explains_unknown_ones() -> None:
    index = KeyIndex(KEYS)
    assert index.find("ml.opt.decay.7.gamma") is KEYS[-1] and index.find("nope") is None
    assert str(index.unknown("ml.lern.rate")) == (
        "unknown key ml.lern.rate (did you mean ml.learn.rate?); "
        "`angelps conf --keys` lists every key"
    )
    assert str(index.unknown("ml.lern.rate", "f:3", listing="docs/x.md lists them")).startswith(
        "f:3: unknown key ml.lern.rate (did you mean"
    )


def test_key_index_finds_table_names() -> None:
    own = Key("ml.opt.decay.<table>.gamma", "float", None, "A table's gamma.", positive)
    index = KeyIndex([*KEYS, own])
    assert index.find("ml.opt.decay.embedding.gamma") is own
    assert index.find("ml.opt.decay.wide_bias.gamma") is own
    assert index.find("ml.opt.decay.3.gamma") is KEYS[-1]  # an index, not a table
    assert index.find("ml.opt.decay.a.b.gamma") is None  # a table name has no dot


def test_an_override_of_none_is_refused(tmp_path: Path) -> None:
    """None dropped the file's value for the default, silently."""
    f = tmp_path / "job.properties"
    f.write_text("ml.learn.rate=0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, {"ml.learn.rate": None}, KEYS)
    assert str(e.value) == (
        "override: ml.learn.rate=None: give a value; to use the default (0.5) leave the key out"
    )
    assert load_config(f, {"ml.learn.rate": 0.2}, KEYS)["ml.learn.rate"] == 0.2


def test_a_key_in_another_case_is_suggested_in_lower_case() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown key ML.LEARN.RATE \(did you mean ml.learn.rate\?\)"
    ):
        load_config(None, ["ML.LEARN.RATE=0.1"], KEYS)


def test_a_byte_order_mark_does_not_start_the_first_key(tmp_path: Path) -> None:
    f = tmp_path / "notepad.properties"  # (as Windows editors save UTF-8)
    f.write_bytes(b"\xef\xbb\xbfml.epoch.num = 2\n")
    conf = load_config(f, [], KEYS)
    assert conf["ml.epoch.num"] == 2 and conf.source("ml.epoch.num") == f"{f}:1"


def test_a_data_file_given_as_the_job_is_one_short_line(tmp_path: Path) -> None:
    f = tmp_path / "train.libsvm"
    f.write_text("".join(f"{i % 2} 3:1 7:0.5\n" for i in range(2000)))
    with pytest.raises(ConfigError) as e:
        load_config(f, [], KEYS)
    assert str(e.value) == (
        f"configuration file {f} does not look like a .properties job: none of its 2000 "
        f"entries is a known key (first: {f}:1: 0); `angelps conf --keys` lists every key"
    )


def test_many_unknown_keys_are_counted_past_the_first_twenty(tmp_path: Path) -> None:
    f = tmp_path / "job.properties"
    f.write_text("ml.epoch.num = 2\n" + "".join(f"my.key.{i} = 1\n" for i in range(30)))
    with pytest.raises(ConfigError) as e:
        load_config(f, [], KEYS)
    text = str(e.value)
    assert text.startswith(f"30 unknown keys: {f}:2: my.key.0; ")
    assert f"{f}:21: my.key.19; and 10 more; `angelps conf --keys` lists every key" in text
    assert "my.key.20" not in text
