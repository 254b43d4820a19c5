"""ONNX files, read and written without holding a graph's weights twice: the face every floor that reads or writes
a graph imports. Each part stands in its own module:

- files.onnx_save: a graph written a weight at a time (`save_onnx`), its weights in a file beside it past
  protobuf's 2 GB limit or from 128 MiB, which ONNX Runtime maps (`save_external`);
- files.onnx_load: a graph read a weight at a time (`load_onnx`), or with its weights left in their file
  (`load_lazy`);
- files.lazy_weights: such a weight, read as a writer takes it (`is_lazy`, `resolved`, `weight_array`,
  `weight_range`, `Weights`, `loaded`), and the file a graph's weights are written into as they are made (`WeightFile`);
- files.onnx_props: the file's metadata read and added without parsing its graph (`read_props`, `add_props`), its
  bytes but its metadata (`graph_pieces`);
- files.onnx_wire: protobuf's wire format, walked a field at a time, and a message's fields copied (`copy_fields`).

Python's protobuf keeps a message's bytes until the whole message goes, so a graph whose weights change is built
anew rather than changed in place."""

from files.lazy_weights import WeightFile, Weights, is_lazy, loaded, resolved, weight_array, weight_range
from files.onnx_load import load_lazy, load_onnx
from files.onnx_props import add_props, graph_pieces, read_props
from files.onnx_save import save_external, save_onnx
from files.onnx_wire import copy_fields

__all__ = [
    "read_props",
    "add_props",
    "save_onnx",
    "save_external",
    "load_onnx",
    "load_lazy",
    "is_lazy",
    "resolved",
    "weight_array",
    "weight_range",
    "Weights",
    "loaded",
    "WeightFile",
    "graph_pieces",
    "copy_fields",
]
