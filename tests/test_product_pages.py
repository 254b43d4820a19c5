"""The product pages and modules speak of the product, never of the work's history: README.md, BENCHMARKS.md,
docs/ (but docs/lab-notes/, where the history is kept), benchmarks/'s pages and every module of the packages name
no issue ("issue 67", "issues 62", "#62"), no ordinal of a session or round of work ("the fourteenth session"),
and no commit hash but on a figure's provenance line (a line that names a commit or gives a date: "at commit
52e6d56, 2026-11-29")."""

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compressor", "converters", "eval", "files", "texts", "tools", "benchmarks", "examples")

# What a page may still say while another change rewrites it: {path: the matches left}.

ISSUE = re.compile(
    r"\b(?:issues?|pull requests?|PRs?)[\s-]*(?:#|no\.\s*)?\d+"  # issue 67, issues 62, issue #5, PR 12
    r"|(?:^|(?<=[\s(\[,;:]))#\d{1,5}(?![\w-])",  # #62 (not a colour: #1f77b4; not a comment's # 1)
    re.IGNORECASE,
)
_ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth"
    r"|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(?:st|nd|rd|th))"
)
SESSION = re.compile(
    rf"(?<!\ba ){_ORDINAL}(?:\s*(?:,|and|or|to)\s*{_ORDINAL})*\s+(?:sessions?|rounds? of work)\b"  # the tenth session
    r"|\bthis (?:work )?session\b|\brounds? of work\b|\bwork sessions?\b",  # ONNX Runtime's is "the session"
    re.IGNORECASE,
)
HEX = re.compile(r"(?<![\w.])[0-9a-f]{7,40}(?!\w)")
PROVENANCE = re.compile(r"\bcommit|\b20\d\d-\d\d-\d\d\b", re.IGNORECASE)


def product_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md"]
    files += [p for p in (ROOT / "docs").rglob("*.md") if "lab-notes" not in p.relative_to(ROOT / "docs").parts]
    files += (ROOT / "benchmarks").rglob("*.md")
    for package in PACKAGES:
        files += (ROOT / package).rglob("*.py")
    return sorted(p for p in set(files) if p.is_file())


@cache
def known_commits() -> tuple[str, ...]:
    """Every commit of the repository's history (none where git or the history is not there)."""
    try:
        out = subprocess.run(
            ["git", "rev-list", "--all"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(out.split())


def is_commit(token: str) -> bool:
    """A hash's look (hex digits with a letter and a digit), or the start of one of this repository's commits."""
    looks = re.search(r"[a-f]", token) and re.search(r"\d", token)
    return bool(looks) or any(c.startswith(token) for c in known_commits())


def history(line: str) -> list[str]:
    """What `line` says of the work's history: issues, ordinals of sessions, hashes off a provenance line."""
    found = [m.group(0).strip() for m in ISSUE.finditer(line)]
    found += [m.group(0) for m in SESSION.finditer(line)]
    if not PROVENANCE.search(line):
        found += [h for h in HEX.findall(line) if is_commit(h)]
    return found


def test_the_pages_name_no_issue_no_session_and_no_hash_off_a_provenance_line():
    bad = []
    for path in product_files():
        name = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found = history(line)
            bad += [f"{name}:{number}: {found}: {line.strip()[:100]}"] if found else []
    assert not bad, (
        "say what the product does or measured; the history goes to docs/lab-notes/, a commit hash only on its "
        "figure's provenance line ('… at commit abc1234, 2026-11-29'):\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    "line",
    [
        "the figure issue 67 asks is not reached",
        "as issues 62 and 67 measured",
        "see Issue #12",
        "measured for #62 on AVX2",
        "(refitted in the thirteenth session through the last three rows)",
        '"Fourth session" to "Thirteenth session"',
        "with the eighth and ninth sessions' writers",
        "since this session",
        "in the 14th session",
        "a round of work later",
        "the peak (9e07439) went down",
        "4.49 GiB at c2dcf32",
    ],
)
def test_history_is_found(line):
    assert history(line), line


def test_a_commit_of_digits_alone_is_found():
    digits = next((c[:7] for c in known_commits() if c[:7].isdigit()), None)
    if digits is None:
        pytest.skip("no commit of this history starts with seven digits (or no history)")
    assert history(f"SmolLM2's peak, 7.21 GiB at {digits}")
    assert not history(f"SmolLM2's peak, 7.21 GiB at commit {digits}, 2026-11-30")


@pytest.mark.parametrize(
    "line",
    [
        "ONNX Runtime folds it when the session starts",
        "sess = ort.InferenceSession(path, options)",
        "a second session of the same graph holds its own arena",
        "the next session's turn",
        "by `compressor run --out runs/demo` at commit `52e6d56279e5bb2de2dd2bf35e6d767a677793ac`, 2026-11-29",
        "a fresh clone of 451b3f6 (2026-11-27, `compressor sweep --out runs/sweep`)",
        "cosine ≥ 0.9999999 for the fp32, int8 and int4 folders",
        'plt.plot(x, y, color="#1f77b4")  # 1 line',
        "four rounds of runs, the first round warms them",
        "a table of 1234567 rows",
    ],
)
def test_product_words_pass(line):
    assert not history(line), (line, history(line))
