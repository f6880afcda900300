"""A features file as a zip archive of `.npy` arrays: read with bounds, written atomically.

Reading opens the zip itself (not `numpy.load`): each member's `.npy` header is read and
its dtype refused before any data (no pickles), its size must be what its shape needs, and
the archive's damage (a cut tail, a flipped byte: zip's CRC) is one `UserError` naming the
file. The JSON header is parsed only after its nesting depth is counted, by a scan of its
brackets outside strings, so no nesting reaches Python's recursion limit.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import zipfile
import zlib
from pathlib import Path

import numpy as np

from bertkit.errors import UserError
from bertkit.training.feature_file_schema import (
    MAX_DEFLATE_RATIO,
    MAX_HEADER_BYTES,
    MAX_JSON_DEPTH,
    MAX_MEMBERS,
)

NOT_FEATURES = (
    "not a bertkit features file (that is the .npz zip archive 'bertkit featurize' writes)"
)
_DAMAGE = (zipfile.BadZipFile, EOFError, zlib.error, ValueError, OSError, NotImplementedError)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def check_features_path(path) -> None:
    """`path` names a regular file: not missing, not a folder, not a device or pipe."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError("features file not found", source=path) from None
    except OSError as error:
        raise UserError(f"cannot read the features file: {error.strerror}", source=path) from None
    if stat.S_ISDIR(mode):
        raise UserError("is a folder, not a features file", source=path)
    if not stat.S_ISREG(mode):
        raise UserError(
            "is not a regular file (a device or a pipe), not a features file", source=path
        )


def read_archive(path) -> dict[str, np.ndarray]:
    """{member name without `.npy`: array} of the archive at `path`."""
    check_features_path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError, ValueError):
        raise UserError(_not_a_zip(path), source=path) from None
    except OSError as error:
        raise UserError(f"cannot read the features file: {error.strerror}", source=path) from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_MEMBERS:
            raise UserError(f"holds {len(infos)} arrays, more than {MAX_MEMBERS}", source=path)
        arrays = {}
        for info in infos:
            name = info.filename.removesuffix(".npy")
            if name == info.filename or name in arrays:
                raise UserError(f"{NOT_FEATURES}: holds {info.filename[:80]!r}", source=path)
            arrays[name] = _read_member(archive, info, name, path)
    return arrays


def _not_a_zip(path) -> str:
    with open(path, "rb") as handle:
        start = handle.read(4)
    if not start:
        return f"is empty (0 bytes): {NOT_FEATURES}"
    if start == b"PK\x03\x04":
        return "is cut short or damaged (not a whole zip archive); featurize again"
    return NOT_FEATURES


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, path) -> np.ndarray:
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or info.flag_bits & 1:
        raise UserError(
            f"{name}: stored in a way numpy does not write; featurize again", source=path
        )
    if info.file_size > MAX_DEFLATE_RATIO * max(info.compress_size, 1) or (
        name == "header" and info.file_size > MAX_HEADER_BYTES
    ):
        raise UserError(
            f"{name}: claims {info.file_size} bytes, past what it can hold", source=path
        )
    try:
        with archive.open(info) as handle:
            return _read_npy(handle, info.file_size, name, path)
    except _DAMAGE as error:
        raise UserError(
            f"{name} is damaged ({error}); featurize again"[:300], source=path
        ) from None


def _read_npy(handle, size: int, name: str, path) -> np.ndarray:
    version = np.lib.format.read_magic(handle)
    if version not in _HEADER_READERS:
        raise UserError(f"{name}: .npy format {version} is not one numpy writes here", source=path)
    shape, fortran_order, dtype = _HEADER_READERS[version](handle)
    if dtype.hasobject:
        raise UserError(
            f"{name} holds Python objects; {NOT_FEATURES}, which holds numbers only", source=path
        )
    needed = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if handle.tell() + needed != size:
        raise UserError(
            f"{name} holds {size - handle.tell()} bytes of data, not the {needed} its shape "
            f"{shape} needs; featurize again",
            source=path,
        )
    data = bytearray(handle.read(needed))
    handle.read(1)  # to the member's end, where zipfile checks its CRC
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran_order else "C")


def parse_header(data: bytes, path):
    """The header's JSON value; its nesting depth is counted before it is parsed."""
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise UserError(
            f"header: JSON nested {depth} levels deep, past {MAX_JSON_DEPTH}; {NOT_FEATURES}",
            source=path,
        )
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as error:
        raise UserError(
            f"header: not UTF-8 (byte {error.start}); {NOT_FEATURES}", source=path
        ) from None
    except ValueError as error:
        raise UserError(f"header: not JSON ({error}); {NOT_FEATURES}"[:300], source=path) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def json_depth(data: bytes) -> int:
    """How deep `[` and `{` nest in JSON text, strings left out (one numpy pass).

    Example:
        >>> json_depth(b'{"a": [[1], "]]]["], "b": {}}')
        3
    """
    code = np.frombuffer(_JSON_STRING.sub(b'""', data), np.uint8)
    steps = np.isin(code, (ord("["), ord("{"))).astype(np.int64)
    steps -= np.isin(code, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def read_header_only(path) -> dict | None:
    """The header of a features file, or None when `path` is not one (any format)."""
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo("header.npy")
            if info.file_size > MAX_HEADER_BYTES:
                return None
            header = parse_header(bytes(_read_member(archive, info, "header", path)), path)
    except (UserError, KeyError, *_DAMAGE):
        return None
    return header if isinstance(header, dict) and "format" in header else None


def save_arrays(handle, arrays: dict) -> None:
    np.savez(handle, **arrays)


def write_atomically(path: Path, arrays: dict) -> None:
    """Writes the archive to a temporary file beside `path`, syncs it, then renames it over
    `path`: a failed write (a full disk) leaves the older file as it was, and no other."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(descriptor, "wb") as handle:
            save_arrays(handle, arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        kept = "; the older file is left as it was" if path.is_file() else ""
        raise UserError(
            f"could not write the features file: {error.strerror or error}{kept}", source=path
        ) from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
