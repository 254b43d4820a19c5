"""The project's own tooling, importable as `tools.*` (installed with the package): the models `make lm`
and `make lm-big` build (SmolLM2, Gemma-3-270M and Qwen2.5-Coder-0.5B from GGUF files on PyPI, the GPT-2 and
LSTM LMs it trains), the LSTM LM that stands for a user's own module, and the whole news text written out."""
