"""The texts every stage reads: the default corpus and its disjoint splits (`corpus`, from CPython's
pydoc topics and the standard library's docstrings, `docstrings`), the second held-out text
(`news`), the general-English token-frequency prior (`prior`) and the tokenizer helpers (`tokens`).
Below `eval` and `converters`, which both import it; it imports only `files`."""

from texts.corpus import default_passages, read_passages

__all__ = ["default_passages", "read_passages"]
