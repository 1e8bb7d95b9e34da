"""Every citation of the specs and design notes in the repo leads somewhere.

Code, tests and docs cite ``docs/spec/PROTOCOL.md`` as ``P§1.3`` (or ``PROTOCOL.md §1.3``),
``docs/spec/SDK.md`` as ``S§1.9`` (or ``SDK.md §1.9``), ``docs/spec/CONFORMANCE.md`` by
section letter and item number (``CONFORMANCE §G items 50-55``, ``#47``, and conformance tests
named ``test_<item>_...``), and ``docs/design/celery-notes.md`` by section. Each must name a
heading or an item those documents have.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import REPO

SPEC = REPO / "docs" / "spec"
DESIGN = REPO / "docs" / "design"
CITING = ("rollout_core", "rollout_gateway", "rollout_worker", "rollout_fleet", "sdk", "tests")
CITING_FILES = (
    "README.md",
    "docs/OPERATIONS.md",
    "docs/PERFORMANCE.md",
    "docs/RELIABILITY.md",
    "docs/WRITE-YOUR-AGENT.md",
)
SECTION = r"§\s?([0-9A-Z](?:[0-9.]*[0-9])?)"
RANGE = re.compile(r"(\d+)\s*[-–]\s*(\d+)")


def headings(document: Path) -> set[str]:
    """Section numbers of a document's headings (``1``, ``1.3``, ``1.3.1``, ``A``, ``A.2``)."""
    numbers = set()
    for line in document.read_text().splitlines():
        match = re.match(r"#+\s+(?:Appendix\s+)?([0-9A-Z](?:[0-9.]*[0-9])?)[.:\s]", line)
        if match:
            numbers.add(match[1])
    return numbers


def conformance() -> tuple[set[str], set[int]]:
    """CONFORMANCE.md's section letters and item numbers."""
    text = (SPEC / "CONFORMANCE.md").read_text()
    letters = set(re.findall(r"^## ([A-Z])\. ", text, re.MULTILINE))
    items = {int(n) for n in re.findall(r"^(\d+)\. ", text, re.MULTILINE)}
    return letters, items


def citing_files() -> Iterator[Path]:
    for folder in CITING:
        for pattern in ("*.py", "*.lua", "*.md"):
            yield from (REPO / folder).rglob(pattern)
    for name in CITING_FILES:
        yield REPO / name


def numbers(text: str) -> Iterator[int]:
    """Item numbers in ``items 50-55``, ``items 22/24``, ``item 139``, ``#47``."""
    for match in re.finditer(r"(?:items?\s+|#)(\d+(?:\s*(?:[-–/,]|and)\s*\d+)*)", text):
        for start, end in RANGE.findall(match[1]):
            yield from range(int(start), int(end) + 1)
        yield from (int(n) for n in re.findall(r"\d+", match[1]))


def citations(path: Path) -> Iterator[tuple[str, str, str]]:
    """(document, cited section or item, where) of every citation in ``path``."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        at = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{number}"
        for prefix, document in (("P", "PROTOCOL"), ("S", "SDK")):
            for section in re.findall(rf"\b{prefix}{SECTION}", line):
                yield document, section, at
            for match in re.finditer(rf"{prefix}§\s?[\d.]+\s*[-–]\s*([\d.]+)", line):
                yield document, match[1], at
        for document in ("PROTOCOL", "SDK"):
            if f"{document}.md" in line:
                tail = line.split(f"{document}.md", 1)[1]
                for section in re.findall(rf"(?<![PS]){SECTION}", tail):
                    yield document, section, at
        if "celery-notes" in line:
            for section in re.findall(SECTION, line.split("celery-notes", 1)[1]):
                yield "celery-notes", section, at
        if "CONFORMANCE" in line:
            tail = line.split("CONFORMANCE", 1)[1]
            for letter in re.findall(r"§([A-Z])\b", tail):
                yield "CONFORMANCE", letter, at
            for item in numbers(tail):
                yield "CONFORMANCE", str(item), at


def conformance_test_items(path: Path) -> Iterator[tuple[str, str, str]]:
    """Conformance tests carry their item number in their name."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = re.match(r"(?:async )?def test_(\d+)_", line.strip())
        if match:
            yield "CONFORMANCE", match[1].lstrip("0"), f"{path.relative_to(REPO)}:{number}"


def known() -> dict[str, set[str]]:
    letters, items = conformance()
    return {
        "PROTOCOL": headings(SPEC / "PROTOCOL.md"),
        "SDK": headings(SPEC / "SDK.md"),
        "celery-notes": headings(DESIGN / "celery-notes.md"),
        "CONFORMANCE": letters | {str(item) for item in items},
    }


def test_the_documents_cited_are_in_the_repo() -> None:
    for document in ("PROTOCOL.md", "SDK.md", "CONFORMANCE.md"):
        assert (SPEC / document).is_file(), document
    assert (DESIGN / "celery-notes.md").is_file()
    assert (DESIGN / "ARCHITECTURE.md").is_file()


def test_every_citation_names_something_that_exists() -> None:
    targets = known()
    cited = [c for path in citing_files() for c in citations(path)]
    conformance_tests = [
        *sorted((REPO / "tests" / "conformance").glob("test_*.py")),
        *sorted((REPO / "sdk" / "tests").glob("test_*.py")),
    ]
    cited += [c for path in conformance_tests for c in conformance_test_items(path)]
    assert len(cited) > 150, "the scan found fewer citations than the repo holds"
    dangling = [f"{at}: {document} {target}" for document, target, at in cited]
    dangling = [
        entry
        for entry, (document, target, _) in zip(dangling, cited, strict=True)
        if target.rstrip(".") not in targets[document]
    ]
    assert dangling == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("see P§1.3.1 and S§2.7", [("PROTOCOL", "1.3.1"), ("SDK", "2.7")]),
        ("(SDK.md §2.4, §2.8)", [("SDK", "2.4"), ("SDK", "2.8")]),
        ("CONFORMANCE §G items 50-52", [("CONFORMANCE", "G")] + [("CONFORMANCE", "50")] * 2),
        ("celery-notes §2.3", [("celery-notes", "2.3")]),
    ],
)
def test_the_scan_reads_each_form(
    tmp_path: Path, line: str, expected: list[tuple[str, str]]
) -> None:
    cited = tmp_path / "cites.py"
    cited.write_text(line + "\n")
    found = [(document, target) for document, target, _ in citations(cited)]
    assert set(expected) <= set(found)


def test_a_dangling_citation_is_caught() -> None:
    targets = known()
    assert "9.9" not in targets["PROTOCOL"]
    assert "999" not in targets["CONFORMANCE"]
    assert {"1.3.1", "2.14", "A.7"} <= targets["PROTOCOL"]
    assert {"A", "S", "47", "152"} <= targets["CONFORMANCE"]
