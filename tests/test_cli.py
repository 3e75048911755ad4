"""The `angelps` command line: verbs, help, the conf verb, exit codes, generated docs."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from learners.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
VERBS = ("train", "predict", "evaluate", "submit", "export", "schedule", "conf", "plot")


def test_every_verb_is_registered_and_has_examples() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    assert set(VERBS) <= set(sub.choices)
    for verb in VERBS:
        help_text = sub.choices[verb].format_help()
        assert "example" in help_text.lower(), f"`angelps {verb} --help` shows no example"
        assert f"angelps {verb}" in help_text


def test_no_verb_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "usage: angelps" in out
    # each example a line a shell can take: a long one goes on after a backslash at the end
    # of its line (it had lost both, joined with blanks in the middle)
    assert "--angel.load.model.path runs/lr/model \\\n      --angel.predict.data.path" in out


def test_conf_shows_values_and_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "job.properties"
    f.write_text(
        "# job\nml.learn.rate = 0.25\nangel.train.data.path = data/a9a/a9a_123d_train.libsvm\n"
    )
    assert main(["conf", "--conf", str(f), "--set", "ml.epoch.num=3"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "0.25" in lines["ml.learn.rate"] and lines["ml.learn.rate"].endswith(f"# {f}:2")
    assert lines["ml.epoch.num"].endswith("# command line")
    assert "angel.ps.number" not in lines  # defaults are hidden without --all
    assert main(["conf", "--conf", str(f), "--all"]) == 0
    out = capsys.readouterr().out
    assert any(
        line.startswith("angel.ps.number") and line.endswith("# default")
        for line in out.splitlines()
    )


def test_conf_refuses_a_schedule_train_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "job.properties"
    f.write_text("ml.opt.decay.class.name = CosineAnealingLR\n")
    assert main(["conf", "--conf", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"angelps: error: ml.opt.decay.class.name=CosineAnealingLR ({f}:1): unknown schedule; "
        "valid names (closest first): CosineAnnealingLR, "
    )
    assert main(["conf", "--set", "ml.opt.decay.wide.class.name=Nope"]) == 2
    assert capsys.readouterr().err.startswith(
        "angelps: error: ml.opt.decay.wide.class.name=Nope (command line): unknown schedule"
    )


def test_conf_keys_lists_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    from learners.keys import all_keys

    assert main(["conf", "--keys"]) == 0
    out = capsys.readouterr().out
    for k in all_keys():
        assert k.name in out
    assert "ml.learn.rate  [float, default 0.5]" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["conf", "--conf", "no/such.properties"],
            "configuration file no/such.properties does not exist",
        ),
        (
            ["conf", "--set", "ml.lern.rate=1"],
            "unknown key ml.lern.rate (did you mean ml.learn.rate?",
        ),
        (
            ["conf", "--set", "ml.learn.rate=fast"],
            "ml.learn.rate=fast is not valid: expected a number",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert err.startswith("angelps: error: ")


def test_bad_line_in_file_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "job.properties"
    f.write_text("ml.learn.rate=0.1\nml.epoch.num = many\n")
    assert main(["conf", "--conf", str(f)]) == 2
    assert f"{f}:2: ml.epoch.num=many is not valid: expected an integer" in capsys.readouterr().err


def test_generated_config_reference_is_current() -> None:
    from angelconf.render import render_markdown
    from learners.keys import key_groups

    current = (ROOT / "docs" / "config.md").read_text()
    assert current == render_markdown(key_groups()), (
        "docs/config.md is stale: run `bash scripts/gen-docs`"
    )


def test_python_dash_m_and_console_script_agree() -> None:
    """`python -m angelps` and the console script pyproject.toml declares print the same
    version; the installed script too, where angelps is installed (a source tree run from
    PYTHONPATH has none: then the declared entry point is called as the script calls it)."""
    import tomllib

    a = subprocess.run(
        [sys.executable, "-m", "angelps", "--version"], capture_output=True, text=True
    )
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["angelps"]
    module, func = entry.split(":")
    call = f"import sys; sys.argv = ['angelps', '--version']; from {module} import {func}; {func}()"
    runs = [[sys.executable, "-c", call]]
    try:
        importlib.metadata.distribution("angelps")
        runs.append([str(Path(sys.executable).with_name("angelps")), "--version"])
    except importlib.metadata.PackageNotFoundError:
        pass
    for argv in runs:
        b = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        assert a.returncode == b.returncode == 0, (argv, b.stderr[-500:])
        assert a.stdout == b.stdout and a.stdout.startswith("angelps "), argv


def test_every_job_file_named_in_docs_and_help_exists() -> None:
    import re

    texts = [
        p.read_text()
        for p in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("learners/*.py")]
    ]
    named = {m for t in texts for m in re.findall(r"conf/[A-Za-z0-9_]+\.properties", t)}
    assert named, "no job file named anywhere"
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"named but missing: {missing}"


@pytest.mark.parametrize("job", sorted(p.name for p in (ROOT / "conf").glob("*.properties")))
def test_every_example_job_loads(job: str) -> None:
    from angelconf.config import load_config
    from learners.keys import all_keys

    conf = load_config(ROOT / "conf" / job, [], all_keys())
    assert (ROOT / conf["angel.train.data.path"]).exists()


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_has_cuda(), reason="the error is for clusters without a GPU")
def test_asking_for_gpus_the_cluster_lacks_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--conf", "conf/lr_a9a.properties", "--set", "angel.worker.gpus=0.5"]
    argv += ["--set", "angel.workergroup.number=2", "--set", "angel.save.model.path="]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "angel.worker.gpus=0.5 with 2 worker(s) needs 1 GPU(s) but the Ray cluster has 0" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["conf", "--conf", "conf/lr_a9a.properties"],
        ["conf", "--keys"],
        ["schedule", "--conf", "conf/lr_a9a.properties", "--steps", "3"],
        ["schedule", "--conf", "conf/lr_a9a.properties", "--ml.opt.decay.on.batch", "true"],
        ["train", "--conf", "conf/lr_a9a.properties", "--set", "ml.no.such.key=1"],
        ["predict", "--conf", "conf/lr_a9a.properties", "--action.type", "nonsense"],
        ["--help"],
    ],
    ids=["conf", "conf-keys", "schedule", "schedule-per-update", "typo", "bad-action", "help"],
)
def test_config_only_verbs_import_neither_torch_nor_ray(argv: list[str], heavy_after) -> None:
    """`angelps conf`, `schedule`, `--help` and a typo's error answer without the heavy stack."""
    code = f"from learners.cli.main import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    assert heavy_after(code) == []


def test_the_script_ends_at_once_after_its_own_ray_with_its_code_and_all_its_output() -> None:
    # Ray loaded but not connected (a job that stopped its own Ray): os._exit after a flush.
    code = (
        "import sys, ray\n"
        "from learners.cli.main import end\n"
        "print('last line', end='')\n"
        "sys.stderr.write('warned')\n"
        "end(3)\n"
        "print('never')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert (run.returncode, run.stdout, run.stderr) == (3, "last line", "warned")
