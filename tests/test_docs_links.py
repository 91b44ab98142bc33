"""Every relative link in the repository's Markdown resolves: the file or folder exists, and a `#anchor` names a
heading of the target file as GitHub slugs it. Pure Python, no model, no build.

Links are read outside fenced code blocks and inline code spans: `[text](target)`, `![alt](target)` and reference
definitions (`[label]: target`). http(s) and mailto links are not followed."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "build", "node_modules", "__pycache__", ".pytest_cache"}
EXTERNAL = ("http://", "https://", "mailto:")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) and ![alt](target); the text may hold one level of brackets, the target may be <...>, a title follows
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"          # [text] or ![alt]
                    r"\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"  # (target
                    r"(?:\s+[\"'(][^)]*)?\s*\)")                          #  "title")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)\s*$")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


def markdown_files(root: Path) -> list[Path]:
    """The repository's Markdown files, outside virtual environments, build trees and git's own folder."""
    found = []
    for path in root.rglob("*.md"):
        parts = path.relative_to(root).parts[:-1]
        if any(part in SKIP_DIRS or part.startswith(".") for part in parts):
            continue
        found.append(path)
    return sorted(found)


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fence = [], ""
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = ""
            continue
        if match:
            fence = match.group(1)
            continue
        lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup reduced to its text, lowercase, punctuation other than
    '-' and '_' removed, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown file offers: its headings' slugs (repeats numbered -1, -2, ... as GitHub does) and
    explicit <a name=...> / id=... anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    prose = _prose_lines(path.read_text(encoding="utf-8"))
    previous = ""
    for number, line in prose:
        title = None
        match = HEADING.match(line)
        if match:
            title = match.group(2)
        elif SETEXT.match(line) and previous.strip() and not previous.lstrip().startswith(("|", "-", "*", ">")):
            title = previous.strip()
        if title is not None:
            base = slug(title)
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
        found.update(HTML_ANCHOR.findall(line))
        previous = line
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in a Markdown file, outside code."""
    result = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        targets = [m.group(1) for m in INLINE.finditer(line)]
        reference = REFERENCE.match(line)
        if reference:
            targets.append(reference.group(1))
        for target in targets:
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            result.append((number, target))
    return result


def broken_links(path: Path, root: Path) -> list[str]:
    """What does not resolve in one Markdown file, one message per link."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for number, target in links(path):
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not target:
            problems.append(f"{where}: empty link")
            continue
        if target.lower().startswith(EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part)
        if file_part.startswith("/"):
            resolved = root / file_part.lstrip("/")
        elif file_part:
            resolved = path.parent / file_part
        else:
            resolved = path
        if not resolved.exists():
            problems.append(f"{where}: no such file or folder")
            continue
        if not anchor:
            continue
        anchor = unquote(anchor)
        if resolved.is_file() and resolved.suffix.lower() == ".md":
            if resolved not in cache:
                cache[resolved] = anchors(resolved)
            if anchor not in cache[resolved]:
                problems.append(f"{where}: no heading '#{anchor}' in {resolved.relative_to(root)}")
        elif not LINE_ANCHOR.match(anchor):
            problems.append(f"{where}: an anchor into a file that has no headings")
    return problems


def check_tree(root: Path) -> list[str]:
    problems = []
    for path in markdown_files(root):
        problems.extend(broken_links(path, root))
    return problems


def test_every_relative_link_and_anchor_in_the_repository_resolves():
    files = markdown_files(ROOT)
    assert ROOT / "README.md" in files and any(p.parent.name == "docs" for p in files)
    problems = check_tree(ROOT)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# The guide\n\n## Set-up, step by step (Linux)\n\ntext\n")
    (tmp_path / "README.md").write_text(
        "See [the guide](docs/guide.md), [its set-up](docs/guide.md#set-up-step-by-step-linux)\n"
        "and [the docs](docs/). Broken: [gone](docs/missing.md), [no heading](docs/guide.md#install),\n"
        "[no heading here](#nothing). Not links: `[code](nowhere.md)`, [web](https://example.invalid/x.md).\n"
        "\n```sh\n[in a block](nowhere.md)\n```\n\n[ref]: docs/also-missing.md\n")
    problems = check_tree(tmp_path)
    assert len(problems) == 4, problems
    assert any("docs/missing.md: no such file" in p for p in problems)
    assert any("#install" in p and "guide.md" in p for p in problems)
    assert any("#nothing" in p for p in problems)
    assert any("docs/also-missing.md" in p for p in problems)
    assert not any("nowhere.md" in p or "example.invalid" in p for p in problems)


def test_slugs_follow_github():
    assert slug("The `lminf` method: Λ-shaped (LM-Infinite)") == "the-lminf-method-λ-shaped-lm-infinite"
    assert slug("Install (pip)") == "install-pip"
    assert slug("CUDA / GPU") == "cuda--gpu"
    assert slug("1.2 Mesa-Extrapolation (`mesa`)") == "12-mesa-extrapolation-mesa"
    assert slug("snake_case [a link](x.md)") == "snake_case-a-link"


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Runs\n\n## Notes\n\n## Notes\n\nTitle\n-----\n")
    assert {"runs", "notes", "notes-1", "title"} <= anchors(page)
