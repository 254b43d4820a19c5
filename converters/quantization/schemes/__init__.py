"""The built-in quantization schemes, one module each: int8, int8-aware, int8-aware-table, int4, int4-aware,
int4-corrected, int4-trained, int8-w4, w4a8, mixed. `registry.schemes()` imports every module in this folder (so a
new scheme is one new file here); importing one scheme's module imports that scheme alone (a row rounded in a process
without PyTorch, whose corrected schemes need it)."""
