"""Decoding a causal LM's ONNX graph on ONNX Runtime, as a user runs it: a decoder per way of reading the graph
(`decoders.py`), a token at a time, greedy or sampled (`sampling.py`), several tokens a pass proposed by a draft
(`drafts.py`, `lookahead.py`, `speculative.py`) and a prompt's continuation (`generate.py`). What it costs per
token is measured in eval (`eval/decode_timing.py`)."""
