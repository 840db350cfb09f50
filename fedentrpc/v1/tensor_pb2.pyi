from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WireDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WIRE_DTYPE_NATIVE: _ClassVar[WireDtype]
    WIRE_DTYPE_FLOAT16: _ClassVar[WireDtype]
    WIRE_DTYPE_BFLOAT16: _ClassVar[WireDtype]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_ZLIB: _ClassVar[Compression]
WIRE_DTYPE_NATIVE: WireDtype
WIRE_DTYPE_FLOAT16: WireDtype
WIRE_DTYPE_BFLOAT16: WireDtype
COMPRESSION_NONE: Compression
COMPRESSION_ZLIB: Compression

class TensorSpec(_message.Message):
    __slots__ = ("dtype", "shape")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TensorGroup(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class TensorListHeader(_message.Message):
    __slots__ = ("tensors", "groups", "wire_dtype", "compression", "raw_bytes", "wire_bytes", "num_chunks", "chunk_checksum")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    groups: _containers.RepeatedCompositeFieldContainer[TensorGroup]
    wire_dtype: WireDtype
    compression: Compression
    raw_bytes: int
    wire_bytes: int
    num_chunks: int
    chunk_checksum: str
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[TensorGroup, _Mapping]]] = ..., wire_dtype: _Optional[_Union[WireDtype, str]] = ..., compression: _Optional[_Union[Compression, str]] = ..., raw_bytes: _Optional[int] = ..., wire_bytes: _Optional[int] = ..., num_chunks: _Optional[int] = ..., chunk_checksum: _Optional[str] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("header", "index", "data", "checksum")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    header: TensorListHeader
    index: int
    data: bytes
    checksum: str
    def __init__(self, header: _Optional[_Union[TensorListHeader, _Mapping]] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ..., checksum: _Optional[str] = ...) -> None: ...

class TransferSettings(_message.Message):
    __slots__ = ("wire_dtype", "compression", "chunk_bytes")
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    wire_dtype: WireDtype
    compression: Compression
    chunk_bytes: int
    def __init__(self, wire_dtype: _Optional[_Union[WireDtype, str]] = ..., compression: _Optional[_Union[Compression, str]] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class BlobRef(_message.Message):
    __slots__ = ("blob_id", "wire_bytes")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    wire_bytes: int
    def __init__(self, blob_id: _Optional[str] = ..., wire_bytes: _Optional[int] = ...) -> None: ...

class FetchBlobRequest(_message.Message):
    __slots__ = ("blob_id", "worker_id")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    worker_id: str
    def __init__(self, blob_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ok", "message")
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    message: str
    def __init__(self, ok: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class ScalarMap(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, float]
    def __init__(self, values: _Optional[_Mapping[str, float]] = ...) -> None: ...
