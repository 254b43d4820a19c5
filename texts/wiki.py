"""General English for the fit text (texts.corpus): the articles of the shortened first file of an English
Wikipedia dump that gensim ships as test data, their markup stripped by gensim's own `filter_wiki`, cut
into passages of whole sentences as the news is (texts.news). Without it the fit text is technical prose
only (pydoc, docstrings), and what is fitted to it (int4-trained's corrections) learns less of the
general English a user's queries are in (BENCHMARKS.md, "General English in the fit text")."""

import bz2
import functools
import importlib.metadata
import re

from compressor.errors import CompressorError
from texts.news import gensim_file, sentence_passages

__all__ = ["WIKI_FILE", "wiki_name", "wiki_passages"]

WIKI_FILE = ("test", "test_data", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
MARKUP_LINE = re.compile(r"^\s*[=*#:;|!{}]")  # headings, lists, indents, tables: not prose
QUOTES = re.compile(r"'{2,}")  # wiki bold and italics


def wiki_name() -> str | None:
    """The articles as the fit text's description names them ("… gensim 4.4.0's test data"); None when the
    installed gensim does not have them (the fit text is then built without them)."""
    if gensim_file(WIKI_FILE)[0] is None:
        return None
    return f"English Wikipedia articles in gensim {importlib.metadata.version('gensim')}'s test data"


@functools.cache
def _all_passages() -> tuple[str, ...]:
    path, missing = gensim_file(WIKI_FILE)
    if path is None:
        raise CompressorError(f"the fit text's Wikipedia articles come with the gensim package, which {missing}")
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki  # imported only when the text is built

    found = []
    try:
        with bz2.open(path) as dump:
            for _title, text, _page in extract_pages(dump):
                if text.lstrip().lower().startswith("#redirect"):
                    continue
                for line in filter_wiki(text).splitlines():
                    if not MARKUP_LINE.match(line) and line.count("|") < 2:
                        found += sentence_passages(QUOTES.sub("", line))
    except (OSError, EOFError) as e:  # a damaged dump file
        raise CompressorError(
            f"the Wikipedia articles in gensim's test data, {str(path)!r}, do not read: {e}"
        ) from None
    return tuple(dict.fromkeys(found))


def wiki_passages() -> list[str]:
    """Every prose passage of the articles, in the dump's order, each once."""
    return list(_all_passages())
