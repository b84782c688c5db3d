"""The docs say what was measured and what the code does: every figure README.md and docs/*.md quote comes from
benchmarks/README.md's table of today's figures, word for word; every command in their ```` ```bash ```` blocks is
one the package has, with options its parser takes; every relative link leads to a file (and heading) that exists;
README.md starts with the two commands, the second exactly what CI runs, and its table lists every command.

A figure is a percentage (``94.7%``) or a measured time written ``N min`` / ``N s`` (``3.7 min``, ``190-236 s``).
Settings and examples are written in words (``a 14-minute budget``, ``--time-budget 15`` ... ``15 minutes``), and
```` ```text ```` blocks show what a command prints, for example; neither is a figure.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "benchmarks" / "README.md"
# the pages that quote figures: the front door and the docs it links to
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

FIGURE = re.compile(r"(?<![\d.,])\d+(?:\.\d+)?(?:%|(?:-\d+(?:\.\d+)?)? (?:min|s)\b)")
TEXT_BLOCK = re.compile(r"^```text\n.*?^```\n", re.DOTALL | re.MULTILINE)

# Percentages that are not today's measurements (a setting, a fixed bug's case), each with the phrase that holds it
# (the pages' own words).
SETTINGS = {
    "the threshold that accepts 95% of them": "the unknown rule's threshold: a run keeps the one accepting 95% of val",
    "(60% against 85% on its val photos)": "docs/robustness.md: the int8 copy that a fixed bug let through",
}


def today_table() -> str:
    """The rows of the tables under benchmarks/README.md's "## Today's figures" heading."""
    text = BENCHMARKS.read_text(encoding="utf-8")
    assert "\n## Today's figures\n" in text, f"{BENCHMARKS}: no '## Today's figures' section"
    section = text.split("\n## Today's figures\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def page_sections(page: Path) -> dict[str, str]:
    """A page's text by its ``## `` headings (the part before the first one under ""), text blocks left out."""
    text = TEXT_BLOCK.sub("", page.read_text(encoding="utf-8"))
    for phrase in SETTINGS:
        text = text.replace(phrase, "")
    sections: dict[str, str] = {}
    heading = ""
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        else:
            sections[heading] = sections.get(heading, "") + line + "\n"
    return sections


def in_table(figure: str, table: str) -> bool:
    """Whether ``figure`` stands in ``table`` as a whole figure ("4 min" is not in "14 min" or "2-4 min")."""
    return re.search(rf"(?<![\d.,-]){re.escape(figure)}(?![\d%])", table) is not None


def test_figure_pattern_reads_figures_not_settings() -> None:
    text = "94.7% in 3.7 min (190-236 s an epoch; 4 min 29 s), a 14-minute budget, 15 minutes, 5 species, 1,000 s"
    assert FIGURE.findall(text) == ["94.7%", "3.7 min", "190-236 s", "4 min", "29 s"]
    assert in_table("4 min", "| 4 min 29 s |") and not in_table("4 min", "| 14 min |")
    assert not in_table("5 min", "| 2-5 min |") and not in_table("94.7%", "| 194.7% |")


def test_every_figure_of_the_pages_is_in_todays_table() -> None:
    table = today_table()
    missing = []
    for page in PAGES:
        for heading, text in page_sections(page).items():
            for figure in FIGURE.findall(text):
                if not in_table(figure, table):
                    missing.append(f"{figure!r} ({page.relative_to(ROOT)}, section {heading or 'top'!r})")
    assert not missing, (
        "the pages quote figures that benchmarks/README.md's 'Today's figures' table does not hold word for word "
        f"(quote the table or link it): {', '.join(missing)}"
    )


# ---- every file the docs name exists -------------------------------------------------------------------------------

# a path with a known extension, optionally under folders: `vit_flowers/training/token_cache.py`, `configs/x.yaml`,
# `data/duplicates.py` (a sub-package's module, named from inside the package), `harness.py`
PATH = re.compile(r"(?<![\w./<>-])(?:[\w.-]+/)*[\w-]+\.(?:py|md|yaml|yml|png|toml|json|txt|csv|html)(?![\w/])")
# the repository's folders whose files the docs name; other first folders (photos/, checkpoints/, runs/ of a user)
# are a user's files in an example
REPOSITORY_FOLDERS = {"vit_flowers", "configs", "benchmarks", "tests", "docs", ".ci"}
# names that are not this repository's files, each with why
# pages that README.md links to and another branch writes, each with who: a link to one (or its name) is accepted
# while it is missing, and checked like any other once it exists
NOT_OURS = {
    "configs/my.yaml": "README.md's example of an error message about a user's config file",
    "validate.py": "timm's script (benchmarks/README.md, Peers)",
}
DOCS = [README, BENCHMARKS, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").glob("*.yaml")),
        *sorted((ROOT / "vit_flowers").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]


def named_paths(text: str) -> list[str]:
    """The repository paths ``text`` names: paths under one of the repository's folders or a sub-package of
    vit_flowers, and bare ``*.py`` names; not ``../`` paths, placeholders (``benchmarks/NAME.py``) or
    :data:`NOT_OURS`."""
    subpackages = {p.name for p in (ROOT / "vit_flowers").iterdir() if p.is_dir()}
    found = []
    for path in PATH.findall(text):
        parts = path.split("/")
        if path in NOT_OURS or any(part.split(".")[0].isupper() for part in parts):
            continue
        in_a_folder = len(parts) > 1 and (parts[0] in REPOSITORY_FOLDERS or parts[0] in subpackages)
        if in_a_folder or len(parts) == 1 and path.endswith(".py"):
            found.append(path)
    return found


def exists(path: str, python_files: set[str]) -> bool:
    """Whether ``path`` is a file or folder of the repository (from its root, or from inside vit_flowers/ for a
    sub-package's module); a bare ``x.py`` whether some Python file of the repository has that name."""
    if "/" not in path:
        return path in python_files
    return (ROOT / path).exists() or (ROOT / "vit_flowers" / path).exists()


def test_named_paths_reads_repository_paths_only() -> None:
    text = ("`vit_flowers/training/token_cache.py`, configs/flowers5.yaml, data/duplicates.py, harness.py, "
            "photos/lily.jpg, ../shared/data/README.md, benchmarks/NAME.py, configs/my.yaml, checkpoints/x/best.pt")
    assert named_paths(text) == ["vit_flowers/training/token_cache.py", "configs/flowers5.yaml",
                                 "data/duplicates.py", "harness.py"]


def test_every_path_the_docs_name_exists() -> None:
    python_files = {p.name for folder in ("vit_flowers", "benchmarks", "tests") for p in (ROOT / folder).rglob("*.py")}
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in DOCS
               for path in named_paths(doc.read_text(encoding="utf-8")) if not exists(path, python_files)]
    assert not missing, f"the docs name files that do not exist: {'; '.join(missing)}"


def test_architecture_names_what_each_subpackage_imports() -> None:
    """docs/architecture.md's table says which sub-packages each may import: every import the code makes is there."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)/` \|[^|]*\|([^|]*)\|$", text, re.MULTILINE)
    assert len(rows) >= 8, "docs/architecture.md: the table of sub-packages was not found"
    wrong = []
    for part, may_import in rows:
        named = set(re.findall(r"`(\w+)(?:/|\.py)`", may_import))
        code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "vit_flowers" / part).rglob("*.py"))
        imported = set(re.findall(r"^\s*from (?:\.\.|vit_flowers\.)(\w+)", code, re.MULTILINE))
        imported |= set(re.findall(r"^\s*from (?:\.\.|vit_flowers) import (\w+)", code, re.MULTILINE))
        if imported - named - {part}:
            wrong.append(f"{part}/ imports {sorted(imported - named - {part})}")
    assert not wrong, f"docs/architecture.md's 'may import' column misses: {'; '.join(wrong)}"


# ---- every relative link leads somewhere ---------------------------------------------------------------------------

# [text](target) and <img src="target">; targets with a scheme (https:, mailto:) are not this repository's
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")
LINKED = [*PAGES, BENCHMARKS, ROOT / "benchmarks" / "HISTORY.md"]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    one numbered (``-1``, ``-2``); headings inside code blocks are not headings."""
    text = re.sub(r"^```.*?^```\n", "", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def links(page: Path) -> list[str]:
    """The relative link targets of ``page`` (outside code blocks), as written."""
    text = re.sub(r"^```.*?^```\n", "", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)
    targets = [a or b for a, b in LINK.findall(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z+.-]*:", t)]


def test_anchors_are_githubs() -> None:
    page = ROOT / "benchmarks" / "README.md"
    assert {"todays-figures", "few-photos-52-60", "machines"} <= anchors(page)


def test_every_relative_link_leads_to_a_file_and_heading() -> None:
    broken = []
    for page in LINKED:
        for target in links(page):
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, f"links that lead nowhere: {'; '.join(broken)}"


# ---- every command the pages show runs as written ------------------------------------------------------------------

BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```\n", re.DOTALL | re.MULTILINE)
# `python -m vit_flowers.X ...`, `torchrun ... -m vit_flowers.X ...`, `vit-flowers X ...`: the command and its
# arguments, up to a comment or the next command of the line
COMMAND_LINE = re.compile(r"(?:-m vit_flowers\.([\w.]+)|(?<![\w-])vit-flowers (\w+))([^#&|;]*)")
MODULE_ALIASES = {"app": "app", "app.command": "app", "attention": "explain"}  # module -> command (old names too)
EXTRA = re.compile(r"pip install -e \"\.\[([\w,-]+)\]\"")


def shown_commands(text: str) -> list[tuple[str, str]]:
    """Each ``(command, arguments)`` that the bash blocks of a page's ``text`` run, lines continued with ``\\``
    joined."""
    found = []
    for block in BASH_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            for module, command, arguments in COMMAND_LINE.findall(line):
                found.append((MODULE_ALIASES.get(module, module) if module else command, arguments.strip()))
    return found


def test_shown_commands_reads_commands_and_their_arguments() -> None:
    text = ('```bash\npython -m vit_flowers.train --data photos   # a comment --not-an-option\n'
            'vit-flowers predict a/ \\\n    --top-k 3 && python -m vit_flowers.app --port 8080\n'
            'torchrun --nproc_per_node 2 -m vit_flowers.train --config configs/smoke.yaml\n```\n'
            '```text\nvit-flowers what a command prints\n```\n')
    assert shown_commands(text) == [("train", "--data photos"), ("predict", "a/      --top-k 3"),
                                    ("app", "--port 8080"), ("train", "--config configs/smoke.yaml")]


def test_every_command_the_pages_show_parses() -> None:
    """Every command of the pages' bash blocks is one of `vit-flowers`'s, and its parser takes the arguments as
    written (options, choices, types): what the pages tell a user to type runs."""
    import contextlib
    import importlib
    import io
    import shlex

    from vit_flowers.cli import COMMANDS

    parsers: dict[str, argparse.ArgumentParser] = {}
    wrong = []
    for page in [*PAGES, BENCHMARKS]:
        for command, arguments in shown_commands(page.read_text(encoding="utf-8")):
            where = f"{page.relative_to(ROOT)}: {command} {arguments}".strip()
            if command not in COMMANDS:
                wrong.append(f"{where} (no such command)")
                continue
            if command not in parsers:
                parsers[command] = importlib.import_module(COMMANDS[command][0]).build_parser()
            stderr = io.StringIO()
            try:
                with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                    args = parsers[command].parse_args(shlex.split(arguments))
            except SystemExit as exc:
                if exc.code:
                    wrong.append(f"{where} ({stderr.getvalue().strip().splitlines()[-1]})")
                continue
            if command == "train":
                problem = train_config_problem(args)
                if problem:
                    wrong.append(f"{where} ({problem})")
    assert not wrong, f"commands the pages show that do not parse: {'; '.join(wrong)}"


def train_config_problem(args: argparse.Namespace) -> str | None:
    """What train's config refuses in a parsed train command (a choice, a range, a key of --config's file), or None:
    train validates its keys' values in its config, not in its parser. ``--pretrained`` is left out (checking it
    reads the weights)."""
    from vit_flowers.train import command_defaults
    from vit_flowers.training.config import config_keys, read_config

    given = {k: v for k, v in vars(args).items() if k in config_keys() and v is not None and k != "pretrained"}
    config = getattr(args, "config", None)
    try:
        read_config(ROOT / config if config else None, given, command_defaults(args))
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError
        return str(exc).splitlines()[0]
    return None


def test_every_extra_the_pages_install_exists() -> None:
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
                 ["optional-dependencies"])
    named = {(page.relative_to(ROOT).as_posix(), extra) for page in PAGES
             for group in EXTRA.findall(page.read_text(encoding="utf-8")) for extra in group.split(",")}
    assert named, "no `pip install -e \".[extra]\"` found in the pages"
    assert not [f"{page}: {extra}" for page, extra in sorted(named) if extra not in extras]


# ---- the front door ------------------------------------------------------------------------------------------------

def test_readme_starts_with_the_two_commands_the_second_what_ci_runs() -> None:
    """README.md's first code block is the two commands of a fresh machine: install and train, install and test; CI
    (.ci/run) runs the second one exactly."""
    first = re.search(r"^```bash\n(.*?)^```\n", README.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)
    assert first, "README.md has no bash block"
    lines = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert len(lines) == 2, f"README.md's first block is not the two commands: {lines}"
    assert lines[0].startswith('pip install -e ".[dev]" && python -m vit_flowers.train')
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert lines[1] in ci, f"README.md's test command {lines[1]!r} is not a line of .ci/run"
    before = README.read_text(encoding="utf-8").split("```bash", 1)[0]
    assert "```" not in before, "README.md shows another block before the two commands"


def test_readme_table_lists_every_command() -> None:
    """README.md's table of commands has a row for each of `vit-flowers`'s commands (cli.COMMANDS), and no other."""
    from vit_flowers.cli import COMMANDS

    rows = re.findall(r"^\| `([\w-]+)` \|", README.read_text(encoding="utf-8"), re.MULTILINE)
    assert sorted(rows) == sorted(COMMANDS), f"README.md's table of commands: {rows}; the commands: {list(COMMANDS)}"
