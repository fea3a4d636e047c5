"""Read and write safetensors files with numpy alone.

The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the end of the header), an
optional "__metadata__" map of strings, then the raw little-endian tensor bytes. This is the
layout src/starling/common/safetensors.h reads and writes; the python oracle and fixtures use
this module because Debian ships no safetensors package.

numpy has no bfloat16, so BF16 tensors are read as float32 (exact: bf16 is the top half of an
fp32) and written from float32 with round-to-nearest-even. `read` reports each tensor's stored
dtype so a BF16 tensor can be written back as BF16.

    tensors, metadata = load("w.safetensors")          # name -> np.ndarray
    save("w.safetensors", tensors, {"format": "pt"})
    save("w.safetensors", {"x": a}, dtypes={"x": "BF16"})
    tensors, metadata = load_torch("w.safetensors")    # name -> torch.Tensor (bf16 kept as bf16)
    save_torch("w.safetensors", model.state_dict())
"""

import json
import os
import struct
from collections import OrderedDict

import numpy as np

# safetensors dtype -> numpy dtype of the bytes on disk (little-endian).
_NUMPY_OF = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits; converted to/from float32
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# numpy dtype -> safetensors dtype, for arrays written without an explicit dtype.
_SAFETENSORS_OF = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("int16"): "I16",
    np.dtype("int8"): "I8",
    np.dtype("uint8"): "U8",
    np.dtype("bool"): "BOOL",
}

# The reference implementation refuses headers beyond this; so do we, rather than trying to
# allocate whatever a corrupt length field says.
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """A file that is missing, truncated or malformed; the message names the file."""


def bf16_bits_to_f32(bits):
    """uint16 bfloat16 bit patterns -> float32 values (exact)."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    """float32 values -> uint16 bfloat16 bit patterns, rounding to nearest, ties to even.

    NaNs stay NaN (a quiet NaN with the sign kept): plain rounding could carry a NaN whose payload
    sits in the low half into the exponent and turn it into an infinity.
    """
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(u.view(np.float32))
    quiet = ((u >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint32)
    return np.where(nan, quiet, rounded).astype(np.uint16)


class SafetensorsData:
    """Everything in one file: tensors in data-offset order, stored dtypes, metadata."""

    def __init__(self, tensors, dtypes, metadata, path):
        self.tensors = tensors  # OrderedDict name -> np.ndarray (BF16 as float32)
        self.dtypes = dtypes  # name -> safetensors dtype string as stored
        self.metadata = metadata  # dict str -> str
        self.path = path


def read(path):
    """Reads and validates a whole file; SafetensorsError naming the file (and tensor) if bad."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise SafetensorsError(f"{path}: cannot read: {e.strerror}") from None
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: {len(blob)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > _MAX_HEADER or 8 + n > len(blob):
        raise SafetensorsError(
            f"{path}: header length {n} exceeds the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: malformed JSON header: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")

    data = memoryview(blob)[8 + n:]
    entries = []
    for name, info in header.items():
        where = f"{path}: tensor '{name}'"
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"{where}: expected keys dtype, shape, data_offsets")
        dtype = info["dtype"]
        if dtype not in _NUMPY_OF:
            raise SafetensorsError(
                f"{where}: unknown dtype {dtype!r} (known: {', '.join(_NUMPY_OF)})")
        shape = info["shape"]
        offsets = info["data_offsets"]
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)):
            raise SafetensorsError(f"{where}: shape must be a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            raise SafetensorsError(f"{where}: data_offsets must be [begin, end]")
        begin, end = offsets
        itemsize = _NUMPY_OF[dtype].itemsize
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= begin <= end <= len(data):
            raise SafetensorsError(
                f"{where}: data_offsets [{begin}, {end}] outside the data ({len(data)} bytes)")
        if end - begin != count * itemsize:
            raise SafetensorsError(
                f"{where}: shape {shape} of {dtype} needs {count * itemsize} bytes, "
                f"data_offsets give {end - begin}")
        entries.append((begin, end, name, dtype, shape))

    entries.sort()
    for (_, prev_end, prev, _, _), (begin, _, name, _, _) in zip(entries, entries[1:]):
        if begin < prev_end:
            raise SafetensorsError(f"{path}: tensors '{prev}' and '{name}' overlap")

    tensors, dtypes = OrderedDict(), {}
    for begin, end, name, dtype, shape in entries:
        # Copy out of the file buffer: writable, aligned, and independent of `blob`.
        arr = np.frombuffer(data[begin:end], dtype=_NUMPY_OF[dtype]).copy().reshape(shape)
        if dtype == "BF16":
            arr = bf16_bits_to_f32(arr)
        tensors[name] = arr.astype(arr.dtype.newbyteorder("="), copy=False)
        dtypes[name] = dtype
    return SafetensorsData(tensors, dtypes, metadata, path)


def load(path):
    """(OrderedDict name -> np.ndarray, metadata dict). BF16 tensors come back as float32."""
    d = read(path)
    return d.tensors, d.metadata


def save(path, tensors, metadata=None, dtypes=None):
    """Writes `tensors` (name -> array-like) in their given order.

    dtypes optionally maps a name to the safetensors dtype to store it as (needed for "BF16",
    which numpy cannot express; the array is then float32 and rounded to nearest even). The file
    is written to a temporary name and renamed, so a failed write leaves no half file behind.
    """
    path = os.fspath(path)
    dtypes = dtypes or {}
    header, chunks, offset = OrderedDict(), [], 0
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    for name, value in tensors.items():
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved and cannot name a tensor")
        arr = np.asarray(value)
        dtype = dtypes.get(name) or _SAFETENSORS_OF.get(arr.dtype)
        if dtype is None:
            raise TypeError(f"tensor '{name}': numpy dtype {arr.dtype} has no safetensors dtype")
        if dtype not in _NUMPY_OF:
            raise ValueError(f"tensor '{name}': unknown safetensors dtype {dtype!r}")
        if dtype == "BF16":
            raw = f32_to_bf16_bits(arr.astype(np.float32))
        else:
            raw = np.ascontiguousarray(arr, dtype=_NUMPY_OF[dtype])
        raw = raw.tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": [int(d) for d in arr.shape],
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)

    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
    text += b" " * (-(8 + len(text)) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# --- torch helpers (torch is imported lazily so the numpy half works without it) ----------------


def to_torch(arrays, dtypes=None):
    """name -> np.ndarray (as `read` returns) to name -> torch.Tensor; BF16 becomes bfloat16."""
    import torch

    dtypes = dtypes or {}
    out = OrderedDict()
    for name, arr in arrays.items():
        # np.require, not np.ascontiguousarray: the latter turns a 0-d array into shape [1].
        t = torch.from_numpy(np.require(arr, requirements=["C", "W"]))
        if dtypes.get(name) == "BF16":
            t = t.to(torch.bfloat16)  # exact: the values came from bf16
        out[name] = t
    return out


def from_torch(tensors):
    """name -> torch.Tensor to (name -> np.ndarray, dtypes) ready for `save`."""
    import torch

    arrays, dtypes = OrderedDict(), {}
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            arrays[name] = t.to(torch.float32).numpy()
            dtypes[name] = "BF16"
        else:
            arrays[name] = t.numpy()
    return arrays, dtypes


def load_torch(path):
    """(OrderedDict name -> torch.Tensor on CPU, metadata dict)."""
    d = read(path)
    return to_torch(d.tensors, d.dtypes), d.metadata


def save_torch(path, tensors, metadata=None):
    """Writes name -> torch.Tensor, keeping each tensor's dtype (bfloat16 included)."""
    arrays, dtypes = from_torch(tensors)
    save(path, arrays, metadata, dtypes)
