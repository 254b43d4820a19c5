"""The default texts: pydoc's eval split, the fit text (pydoc, docstrings and Wikipedia, cached) and the news."""

import hashlib
import importlib.util
import itertools
import json
import os
import re
from pathlib import Path

import pytest

from compressor.errors import CompressorError
from texts import corpus, news, wiki
from texts.corpus import FIT, SECOND, SPLITS, default_passages, passages
from texts.docstrings import Source, docstring_sources
from texts.news import PASSAGE_WORDS, SECOND_PASSAGES, all_news_passages, news_passages
from texts.wiki import WIKI_FILE, wiki_name, wiki_passages

# One small package's docstrings: what the cache's handling is checked on (the whole fit text takes ~25 s to build)
SMALL = (Source("the json package", Path(json.__file__).parent),)


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[str, list[str]]:
    """The default text's splits: the fit text is built once a session (kept in memory), its cache
    in a temporary folder (this fixture comes before conftest's, which is per test)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        patch.setattr(corpus, "docstring_sources", docstring_sources)  # the run's own, not the suite's small text
        patch.setattr(corpus, "wiki_name", wiki_name)
        corpus._fit_text.cache_clear()
        try:
            return {split: default_passages(split) for split in SPLITS}
        finally:
            corpus._fit_text.cache_clear()


@pytest.fixture(scope="module")
def pydoc() -> list[str]:
    """pydoc's paragraphs, by the rule the eval split has always had."""
    from pydoc_data.topics import topics

    blocks = (" ".join(p.split()) for key in sorted(topics) for p in re.split(r"\n\s*\n", topics[key]))
    return list(dict.fromkeys(p for p in blocks if len(p.split()) >= 8))


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def test_the_default_splits_are_disjoint_and_each_passage_is_once(parts):
    assert all(len(p) > 100 and len(set(p)) == len(p) for p in parts.values())
    for a, b in itertools.combinations(SPLITS, 2):
        assert not set(parts[a]) & set(parts[b]), (a, b)


def test_the_eval_split_is_every_fifth_pydoc_paragraph(parts, pydoc):
    assert parts["eval"] == pydoc[::5]
    assert passages(None, "eval") == (pydoc[::5], "pydoc_data.topics, eval split (paragraphs with i % 5 == 0)")


def test_the_fit_text_is_several_mb_of_pydoc_docstrings_and_wikipedia_mixed(parts, pydoc, real_fit_text):
    assert sum(len(p.encode()) for split in FIT for p in parts[split]) > 3e6
    first = parts["calib"][:256]  # the first passages calibration reads
    assert 0 < sum(p in set(pydoc) for p in first) < len(first)
    assert set(pydoc[1::5]) <= set(parts["calib"])
    assert {p for i, p in enumerate(pydoc) if i % 5 > 1} <= set(parts["finetune"])
    names = [s.name for s in docstring_sources()]
    assert [n.split()[0] for n in names[1:]] == ["numpy", "scipy", "matplotlib"]  # all installed here
    for split in FIT:
        assert parts[split] == sorted(parts[split], key=sha1)
        texts, where = passages(None, split)
        assert texts == parts[split]
        sources = f"the docstrings of {', '.join(names)} and English Wikipedia articles in gensim"
        assert where.startswith(f"pydoc_data.topics, {sources}") and f"({len(texts)} passages, {split} split)" in where


def test_wikipedia_passages_are_prose_in_the_fit_text_by_their_sha1(parts):
    passages_ = wiki_passages()
    assert len(passages_) > 5000 and len(set(passages_)) == len(passages_)
    assert passages_[0].startswith("Anarchism is a political philosophy")  # the dump's first article
    assert all(PASSAGE_WORDS[0] <= len(p.split()) <= PASSAGE_WORDS[1] for p in passages_)
    assert not any("[[" in p or "{{" in p or "''" in p or p.lstrip().startswith(("=", "*", "|")) for p in passages_)
    for p in passages_[:: len(passages_) // 50]:
        assert p in (parts["calib"] if int(sha1(p), 16) % 5 == 0 else parts["finetune"])
    assert not set(passages_) & set(all_news_passages())


def test_without_the_articles_the_fit_text_is_built_without_them(monkeypatch):
    gensim_file = news.gensim_file
    monkeypatch.setattr(
        wiki, "gensim_file", lambda parts: (None, "is not installed") if parts == WIKI_FILE else gensim_file(parts)
    )
    assert wiki_name() is None
    stdlib = docstring_sources()[0].folder
    one = (Source("json", stdlib / "json"),)
    assert corpus._cache_file(one, None) != corpus._cache_file(one, "English Wikipedia articles")
    assert corpus._build.__wrapped__(one, wiki_name()) == corpus._build.__wrapped__(one)
    texts, where = passages(None, "calib")
    assert "Wikipedia" not in where and where.startswith("pydoc_data.topics and the docstrings of")


def test_the_fit_text_is_deterministic_and_a_paragraphs_split_its_own(pydoc):
    stdlib = docstring_sources()[0].folder
    both = (Source("json", stdlib / "json"), Source("email", stdlib / "email"))
    built = corpus._build.__wrapped__(both)
    assert built == corpus._build.__wrapped__(both)
    alone = corpus._build.__wrapped__(both[:1])
    for split in FIT:
        assert set(alone[split]) <= set(built[split])  # the other source moves no paragraph
        docs = set(built[split]) - set(pydoc)
        assert docs and all((int(sha1(p), 16) % 5 == 0) == (split == "calib") for p in docs)


def test_a_cache_hit_equals_a_fresh_build(tmp_path):
    sources, wiki_ = tuple(docstring_sources()), wiki_name()
    assert corpus._cache_file(sources, wiki_).is_relative_to(os.environ["XDG_CACHE_HOME"])
    path = tmp_path / "fit.json"
    fresh = corpus._cached_fit_text(path, sources, wiki_)
    assert fresh is corpus._build(sources, wiki_) and path.is_file()
    assert corpus._load(path) == fresh == corpus._cached_fit_text(path, sources, wiki_)


@pytest.mark.parametrize(
    "content", [b"{not json", b"\xff\xfe\x00", b'{"calib": [1], "finetune": ["a"]}', b'{"calib": [], "finetune": []}']
)
def test_a_damaged_cache_file_is_built_again(tmp_path, capsys, content):
    sources = SMALL
    path = tmp_path / "fit.json"
    path.write_bytes(content)
    assert corpus._cached_fit_text(path, sources) == corpus._build(sources) == corpus._load(path)
    assert "does not load; building it again" in capsys.readouterr().err


def test_an_unwritable_cache_is_a_warning(tmp_path, capsys):
    sources = SMALL
    (tmp_path / "file").write_text("not a folder")
    assert corpus._cached_fit_text(tmp_path / "file" / "fit.json", sources) == corpus._build(sources)
    assert "warning: cannot cache the default text" in capsys.readouterr().err


def test_the_second_text_is_short_news_passages_unlike_the_default_text(parts):
    every, second = all_news_passages(), news_passages()
    assert len(second) == SECOND_PASSAGES < len(every) and news_passages() == second
    assert all(PASSAGE_WORDS[0] <= len(p.split()) <= PASSAGE_WORDS[1] <= 100 for p in every)
    assert not set(every) & {p for split in SPLITS for p in parts[split]}
    places = [every.index(p) for p in second]
    assert places == sorted(set(places)) and places[0] == 0 and places[-1] > 0.99 * len(every)
    assert news_passages(len(every) + 5) == every
    texts, where = passages(None, SECOND)
    assert texts == second and f"Lee corpus in gensim's test data ({SECOND_PASSAGES} of its" in where


def test_without_gensim_the_second_text_is_one_sentence(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gensim" else find_spec(name, *a))
    news._all_passages.cache_clear()  # built again, with gensim, by the next test that reads it
    with pytest.raises(CompressorError, match="the gensim package, which is not installed: pip install gensim") as e:
        passages(None, SECOND)
    assert "\n" not in str(e.value)


def test_a_damaged_wikipedia_file_is_one_sentence(tmp_path, monkeypatch):
    damaged = tmp_path / "dump.bz2"
    damaged.write_bytes(b"not bz2 at all")
    monkeypatch.setattr(wiki, "gensim_file", lambda parts: (damaged, ""))
    wiki._all_passages.cache_clear()  # built again, from the real file, by the next test that reads it
    with pytest.raises(CompressorError, match="the Wikipedia articles in gensim's test data, .* do not read") as e:
        wiki_passages()
    assert "\n" not in str(e.value)
    wiki._all_passages.cache_clear()
