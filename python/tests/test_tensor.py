"""qkv.Tensor and NumPy / DLPack: shared memory both ways, dtypes and strides kept."""
import gc

import numpy as np
import pytest

import qkv

DTYPES = [(np.float32, "F32"), (np.float16, "F16"), (np.int64, "I64"), (np.int32, "I32"), (np.int8, "I8"),
          (np.uint8, "U8")]


@pytest.mark.parametrize("np_dtype,name", DTYPES)
def test_numpy_round_trip_shares_memory(np_dtype, name):
    a = np.arange(24).astype(np_dtype).reshape(2, 3, 4)
    t = qkv.from_dlpack(a)
    assert t.shape == (2, 3, 4) and t.dtype == name and t.strides == (12, 4, 1)
    b = t.numpy()
    assert b.dtype == np_dtype and np.array_equal(a, b)
    a[1, 2, 3] = 7  # one memory: a write through NumPy shows in the tensor's view
    assert b[1, 2, 3] == 7
    assert np.shares_memory(a, b)


def test_non_contiguous_strides_are_kept_without_a_copy():
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    for view in (base[:, ::2], base.T, base[1:5, 2:7], base[::3, 1::3]):
        t = qkv.from_dlpack(view)
        assert t.shape == view.shape
        assert tuple(s * 4 for s in t.strides) == view.strides  # qkv counts elements, NumPy bytes
        assert not t.is_contiguous() or view.flags.c_contiguous
        back = t.numpy()
        assert back.strides == view.strides and np.shares_memory(back, base)
        np.testing.assert_array_equal(back, view)
        c = t.contiguous().numpy()  # the copy when asked for: the same values, its own memory
        np.testing.assert_array_equal(c, view)
        assert c.flags.c_contiguous and not np.shares_memory(c, base)


def test_dlpack_both_ways():
    a = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)[:, 1:]
    t = qkv.Tensor.from_dlpack(a)
    b = np.from_dlpack(t)  # NumPy reads qkv's __dlpack__
    assert np.shares_memory(a, b) and b.strides == a.strides
    np.testing.assert_array_equal(a, b)


def test_the_array_outlives_its_python_name():
    t = qkv.from_dlpack(np.arange(5, dtype=np.int64) * 3)  # the only reference to the array is the tensor's
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), [0, 3, 6, 9, 12])
    b = t.numpy()
    del t
    gc.collect()
    np.testing.assert_array_equal(b, [0, 3, 6, 9, 12])  # and the tensor's memory outlives the tensor


def test_bfloat16_goes_through_dlpack_not_numpy():
    t = qkv.from_dlpack(np.array([1.5, -2.25, 3.0], dtype=np.float32)).to("bf16")
    assert t.dtype == "BF16"
    with pytest.raises(qkv.Error, match="bfloat16"):
        t.numpy()
    np.testing.assert_array_equal(t.to("F32").numpy(), [1.5, -2.25, 3.0])  # exact in bf16
    torch = pytest.importorskip("torch")
    x = torch.from_dlpack(t)
    assert x.dtype == torch.bfloat16 and x.float().tolist() == [1.5, -2.25, 3.0]


def test_torch_interchange():
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    t = qkv.from_dlpack(x)
    assert t.shape == (4, 3) and t.strides == (1, 4)
    y = torch.from_dlpack(t)
    x[0, 1] = 100
    assert y[0, 1] == 100


def test_bad_arrays_are_errors():
    with pytest.raises(qkv.Error, match="negative stride"):
        qkv.from_dlpack(np.arange(4, dtype=np.float32)[::-1])
    with pytest.raises(qkv.Error, match="no qkv dtype"):
        qkv.from_dlpack(np.zeros(3, dtype=np.float64))
    with pytest.raises(TypeError):
        qkv.from_dlpack("not an array")
    with pytest.raises(qkv.Error, match="dtype 'F99'"):
        qkv.from_dlpack(np.zeros(3, dtype=np.float32)).to("F99")


def test_read_only_arrays_are_copied():
    a = np.arange(3, dtype=np.float32)
    a.flags.writeable = False
    t = qkv.from_dlpack(a)
    assert not np.shares_memory(t.numpy(), a)
    np.testing.assert_array_equal(t.numpy(), a)
