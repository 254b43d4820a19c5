import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from compressor.errors import CompressorError
from files.onnx_files import add_props, read_props


def _graph_file(path, props=None):
    """A MatMul by a 64 × 64 weight (a graph field of some 16 kB for the reader to skip), with `props`."""
    weight = numpy_helper.from_array(np.arange(64 * 64, dtype=np.float32).reshape(64, 64), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if props:
        helper.set_model_props(model, props)
    onnx.save_model(model, str(path))
    return path


def test_props_are_read_past_the_graph_and_added_as_onnx_and_onnx_runtime_read_them(tmp_path):
    path = _graph_file(tmp_path / "m.onnx", {"a": "1"})
    assert read_props(path) == {"a": "1"}
    add_props(path, {"b": "2", "c": "x y"})
    assert read_props(path) == {"a": "1", "b": "2", "c": "x y"}
    model = onnx.load(str(path))
    onnx.checker.check_model(model)  # one entry a key, the graph whole
    assert {p.key: p.value for p in model.metadata_props} == {"a": "1", "b": "2", "c": "x y"}
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map == {"a": "1", "b": "2", "c": "x y"}
    x = np.ones((1, 64), np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x @ numpy_helper.to_array(model.graph.initializer[0]))


def test_a_key_held_already_is_refused_and_the_file_left_as_it_was(tmp_path):
    path = _graph_file(tmp_path / "m.onnx", {"a": "1"})
    before = path.read_bytes()
    with pytest.raises(ValueError, match="holds the metadata key 'a' already"):
        add_props(path, {"b": "2", "a": "3"})
    assert path.read_bytes() == before


def test_a_graph_past_the_limit_is_saved_with_its_weights_beside_it_and_kept_whole(tmp_path, monkeypatch):
    from files import lazy_weights, onnx_files, onnx_save

    model = onnx.load(str(_graph_file(tmp_path / "small.onnx")))
    monkeypatch.setattr(onnx_save, "TWO_GB", 1000)  # this graph's 16 kB pass it
    onnx_files.save_onnx(model, tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").stat().st_size >= 64 * 64 * 4
    assert (tmp_path / "big.onnx").stat().st_size < 64 * 64 * 4  # the weights are not in the graph's file
    assert numpy_helper.to_array(model.graph.initializer[0]).shape == (64, 64)  # and still in the caller's model
    onnx.checker.check_model(str(tmp_path / "big.onnx"))
    (stored,) = onnx.load(str(tmp_path / "big.onnx"), load_external_data=False).graph.initializer
    assert int({e.key: e.value for e in stored.external_data}["offset"]) % lazy_weights.ALIGN == 0
    np.testing.assert_array_equal(
        numpy_helper.to_array(onnx.load(str(tmp_path / "big.onnx")).graph.initializer[0]),
        numpy_helper.to_array(model.graph.initializer[0]),
    )
    x = np.ones((1, 64), np.float32)
    session = onnxruntime.InferenceSession(str(tmp_path / "big.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x @ numpy_helper.to_array(model.graph.initializer[0]))


def test_a_graph_written_in_place_keeps_its_weights_file_under_the_final_name_and_no_stale_one(tmp_path, monkeypatch):
    from files import onnx_files, onnx_save
    from files.atomic import atomic_file

    model = onnx.load(str(_graph_file(tmp_path / "small.onnx")))
    monkeypatch.setattr(onnx_save, "MAPPED_FROM", 1000)  # this graph's 16 kB pass it
    (tmp_path / "out").mkdir()
    with atomic_file(tmp_path / "out" / "model.onnx") as tmp:
        onnx_files.save_onnx(model, tmp)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.onnx", "model.onnx.data"]
    x = np.ones((1, 64), np.float32)
    session = onnxruntime.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x @ numpy_helper.to_array(model.graph.initializer[0]))
    with pytest.raises(RuntimeError), atomic_file(tmp_path / "out" / "other.onnx") as tmp:
        onnx_files.save_onnx(model, tmp)
        raise RuntimeError("the writer failed")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.onnx", "model.onnx.data"]
    monkeypatch.setattr(onnx_save, "MAPPED_FROM", 2**28)  # the graph written again fits in one file
    with atomic_file(tmp_path / "out" / "model.onnx") as tmp:
        onnx_files.save_onnx(model, tmp)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.onnx"]  # the old weights file gone
    session = onnxruntime.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x @ numpy_helper.to_array(model.graph.initializer[0]))


@pytest.mark.parametrize("beside", [False, True])
def test_a_lazy_graph_reads_each_weight_from_its_file_and_is_written_as_the_graph_it_came_from(
    tmp_path, monkeypatch, beside
):
    from files import onnx_files, onnx_save

    path = _graph_file(tmp_path / "m.onnx")
    if beside:  # its weights in the file beside it, as a graph past protobuf's limit is saved
        monkeypatch.setattr(onnx_save, "TWO_GB", 1000)
        onnx_files.save_onnx(onnx.load(str(path)), tmp_path / "big.onnx")
        path = tmp_path / "big.onnx"
    whole = onnx_files.load_onnx(path)
    lazy = onnx_files.load_lazy(path)
    (weight,) = lazy.graph.initializer
    assert onnx_files.is_lazy(weight) and not weight.raw_data and list(weight.dims) == [64, 64]
    expected = numpy_helper.to_array(whole.graph.initializer[0])
    np.testing.assert_array_equal(onnx_files.weight_array(weight), expected)
    np.testing.assert_array_equal(numpy_helper.to_array(onnx_files.resolved(weight)), expected)
    weights = onnx_files.Weights(lazy.graph)  # read at each access, of a lazy graph or a whole one alike
    assert list(weights) == [weight.name] and len(weights) == 1
    np.testing.assert_array_equal(weights[weight.name], expected)
    np.testing.assert_array_equal(onnx_files.Weights(whole.graph)[weight.name], expected)
    onnx_files.save_onnx(lazy, tmp_path / "again.onnx")  # each weight read as it is written
    again = onnx_files.load_onnx(tmp_path / "again.onnx")
    assert again.SerializeToString() == whole.SerializeToString()
    assert not onnx_files.load_onnx(path, weights=False).graph.initializer[0].raw_data


def test_a_lazy_graph_whose_weights_sit_outside_its_folder_is_refused(tmp_path):
    from files import onnx_files

    (tmp_path / "inner").mkdir()
    onnx_files.save_external(onnx.load(str(_graph_file(tmp_path / "m.onnx"))), tmp_path / "inner" / "g.onnx")
    (tmp_path / "inner" / "g.onnx.data").rename(tmp_path / "g.onnx.data")
    skeleton = onnx.load(str(tmp_path / "inner" / "g.onnx"), load_external_data=False)
    for entry in skeleton.graph.initializer[0].external_data:
        entry.value = "../g.onnx.data" if entry.key == "location" else entry.value
    onnx.save_model(skeleton, str(tmp_path / "inner" / "g.onnx"))
    with pytest.raises(CompressorError, match="outside its folder"):
        onnx_files.load_lazy(tmp_path / "inner" / "g.onnx")


def test_arrays_written_in_pieces_are_stored_as_a_copy_of_them_would_be_and_ranged_in_pieces(tmp_path, monkeypatch):
    from files import lazy_weights, onnx_files, onnx_save

    monkeypatch.setattr(lazy_weights, "COPY_BYTES", 100)  # a 64 × 64 float32 weight in many pieces
    values = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    view = values.T  # not contiguous: each piece copied as it is written
    with onnx_files.WeightFile(tmp_path / "weights") as weights:
        lazy = weights.add_array("w", view)
        small = weights.add_array("b", values[0, :4])  # under INLINE_BYTES: in the graph itself
    assert onnx_files.is_lazy(lazy) and not onnx_files.is_lazy(small)
    np.testing.assert_array_equal(onnx_files.weight_array(lazy), view)
    np.testing.assert_array_equal(numpy_helper.to_array(small), values[0, :4])
    assert onnx_files.weight_range(lazy) == (float(values.min()), float(values.max()))

    model = onnx.load(str(_graph_file(tmp_path / "m.onnx")))
    for way, initializer in (("tensor", numpy_helper.from_array(view.copy(), "w")), ("pair", ("w", view))):
        (tmp_path / way).mkdir()
        onnx_save.save_external(model, tmp_path / way / "g.onnx", [initializer])
    for name in ("g.onnx", "g.onnx.data"):
        assert (tmp_path / "pair" / name).read_bytes() == (tmp_path / "tensor" / name).read_bytes()
