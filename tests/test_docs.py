"""The docs say what was measured: every figure README.md quotes comes from benchmarks/README.md's table of today's
figures, word for word.

A figure is a percentage (``94.7%``) or a measured time written ``N min`` / ``N s`` (``3.7 min``, ``190-236 s``).
Settings and examples are written in words (``a 14-minute budget``, ``--time-budget 15`` ... ``15 minutes``), and
```` ```text ```` blocks show what a command prints, for example; neither is a figure.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "benchmarks" / "README.md"

FIGURE = re.compile(r"(?<![\d.,])\d+(?:\.\d+)?(?:%|(?:-\d+(?:\.\d+)?)? (?:min|s)\b)")
TEXT_BLOCK = re.compile(r"^```text\n.*?^```\n", re.DOTALL | re.MULTILINE)

# Percentages that are settings, not measurements, each with the phrase that holds it (README.md's own words).
SETTINGS = {
    "the threshold that accepts 95% of them": "the unknown rule's threshold: a run keeps the one accepting 95% of val",
}


def today_table() -> str:
    """The rows of the tables under benchmarks/README.md's "## Today's figures" heading."""
    text = BENCHMARKS.read_text(encoding="utf-8")
    assert "\n## Today's figures\n" in text, f"{BENCHMARKS}: no '## Today's figures' section"
    section = text.split("\n## Today's figures\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def readme_sections() -> dict[str, str]:
    """README.md's text by its ``## `` headings (the part before the first one under ""), text blocks left out."""
    text = TEXT_BLOCK.sub("", README.read_text(encoding="utf-8"))
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


def test_every_readme_figure_is_in_todays_table() -> None:
    table = today_table()
    missing = []
    for heading, text in readme_sections().items():
        for figure in FIGURE.findall(text):
            if not in_table(figure, table):
                missing.append(f"{figure!r} (README.md, section {heading or 'top'!r})")
    assert not missing, (
        "README.md quotes figures that benchmarks/README.md's 'Today's figures' table does not hold word for word "
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
