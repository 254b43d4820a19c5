"""The project's own tooling, importable as `tools.*` (installed with the package): the models `make lm`
builds (SmolLM2 from its GGUF file, the GPT-2 and LSTM LMs it trains), the LSTM LM that stands for a
user's own module, and the whole news text written out."""
