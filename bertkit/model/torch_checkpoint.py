"""PyTorch `pytorch_model.bin` files read without PyTorch, as NumPy arrays or safetensors.

A zip-format state dict (PyTorch >= 1.6) is unpickled by an unpickler that allows only a
state dict's globals (storage classes, `_rebuild_tensor_v2`, `OrderedDict`): a file that
asks for any other code is refused, not run.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from bertkit.errors import UserError

try:
    import ml_dtypes
except ImportError:  # bfloat16 tensors are then upcast to float32.
    ml_dtypes = None

# PyTorch storage classes -> NumPy dtypes without byte order; bfloat16 is read as its bits.
_STORAGE_DTYPES = {
    "FloatStorage": "f4",
    "HalfStorage": "f2",
    "DoubleStorage": "f8",
    "BFloat16Storage": "u2",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}


class _StorageType(str):
    """Stands for `torch.FloatStorage` and the like: the storage class name."""


def _rebuild_tensor(storage, storage_offset, size, stride, *_requires_grad_hooks_metadata):
    """`torch._utils._rebuild_tensor_v2` for a 1-D NumPy storage: a strided view, copied."""
    size, stride = tuple(size), tuple(stride)
    if 0 in size:
        return np.zeros(size, storage.dtype)
    extents = [(length - 1) * step for length, step in zip(size, stride, strict=True)]
    last = storage_offset + sum(extents)  # Index of the last element the view reads.
    if storage_offset < 0 or min(stride, default=0) < 0 or last >= storage.size:
        raise pickle.UnpicklingError("a tensor lies outside its storage; the file is corrupt")
    strides = [step * storage.itemsize for step in stride]
    return np.lib.stride_tricks.as_strided(storage[storage_offset:], size, strides).copy()


class _StateDictUnpickler(pickle.Unpickler):
    """Unpickles a PyTorch state dict into NumPy arrays; refuses every other global."""

    def __init__(self, file, load_storage):
        super().__init__(file)
        self._load_storage = load_storage

    def find_class(self, module, name):
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"refusing to load global '{module}.{name}'")

    def persistent_load(self, pid):
        # ('storage', storage class, key of its file under data/, location, element count)
        if not (isinstance(pid, tuple) and len(pid) == 5 and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return self._load_storage(pid[1], str(pid[2]), int(pid[4]))


def _storage_loader(archive: zipfile.ZipFile, record_dir: str, byteorder: str):
    """A function (storage class, key, element count) -> 1-D array; reads each storage once."""
    cache = {}

    def load(type_name: str, key: str, numel: int) -> np.ndarray:
        if key not in cache:
            dtype = np.dtype(byteorder + _STORAGE_DTYPES[type_name])
            data = archive.read(f"{record_dir}data/{key}")
            if len(data) < numel * dtype.itemsize:
                raise pickle.UnpicklingError(f"storage {key} is truncated; the file is corrupt")
            array = np.frombuffer(data, dtype, count=numel)  # Read-only; tensors copy it.
            if not dtype.isnative:
                array = array.astype(dtype.newbyteorder("="))
            cache[key] = _bfloat16(array) if type_name == "BFloat16Storage" else array
        return cache[key]

    return load


def _bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values from their uint16 bit patterns (as float32 without ml_dtypes)."""
    if ml_dtypes is not None:
        return bits.view(ml_dtypes.bfloat16)
    return (bits.astype(np.uint32) << 16).view(np.float32)  # The top half of a float32.


def read_torch_bin(bin_path) -> dict[str, np.ndarray]:
    """Reads a PyTorch state dict (zip format, PyTorch >= 1.6) as NumPy arrays, without PyTorch.

    Returns:
        Tensor name -> contiguous array, in the file's order.

    Raises:
        UserError: the file is missing, in the legacy format, or not a plain state dict.
    """
    bin_path = Path(bin_path)
    if not bin_path.is_file():
        raise UserError("no such file", source=bin_path)
    if not zipfile.is_zipfile(bin_path):
        raise UserError(
            "legacy (non-zip) PyTorch format is not supported; re-save the model "
            "with a recent transformers version (save_pretrained)",
            source=bin_path,
        )
    with zipfile.ZipFile(bin_path) as archive:
        names = archive.namelist()
        pickles = [name for name in names if name.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise UserError("not a PyTorch checkpoint (no single data.pkl)", source=bin_path)
        record_dir = pickles[0].removesuffix("data.pkl")
        big_endian = (
            f"{record_dir}byteorder" in names
            and archive.read(f"{record_dir}byteorder").strip() == b"big"
        )
        load_storage = _storage_loader(archive, record_dir, ">" if big_endian else "<")
        with archive.open(pickles[0]) as file:
            try:
                state = _StateDictUnpickler(file, load_storage).load()
            except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as error:
                # Refused globals, and the damage a truncated or edited file shows as.
                raise UserError(str(error), source=bin_path) from None
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise UserError("does not hold a flat state dict of tensors", source=bin_path)
    return dict(state)


def torch_bin_to_safetensors(bin_path, target_path) -> Path:
    """Converts a PyTorch `pytorch_model.bin` into a safetensors file; returns `target_path`."""
    target_path = Path(target_path)
    save_file(read_torch_bin(bin_path), str(target_path), metadata={"format": "pt"})
    return target_path
