"""Quantization of exported graphs with ONNX Runtime's own tools (DESIGN §2.6): the schemes and their
entry point (`quantize`), 4-bit weights (`int4`), SmoothQuant's migration (`smoothing`) and a width
per module under a byte budget (`mixed`)."""
