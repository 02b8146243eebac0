"""Prints the README's command N (the bash block under its heading "**N. ..."): what CI runs."""

import pathlib
import re
import sys


def readme_command(n: int, readme: pathlib.Path = pathlib.Path(__file__).resolve().parent.parent / "README.md") -> str:
    text = readme.read_text(encoding="utf-8")
    m = re.search(r"\*\*" + str(n) + r"\. .*?```bash\n(.+?)\n```", text, re.S)
    if m is None:
        raise SystemExit(f"ci: README.md has no command {n}")
    return m.group(1)


if __name__ == "__main__":
    print(readme_command(int(sys.argv[1])))
