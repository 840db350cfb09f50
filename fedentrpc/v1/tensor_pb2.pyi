from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WireDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WIRE_DTYPE_UNSPECIFIED: _ClassVar[WireDtype]
    WIRE_DTYPE_NATIVE: _ClassVar[WireDtype]
    WIRE_DTYPE_FLOAT16: _ClassVar[WireDtype]
    WIRE_DTYPE_BFLOAT16: _ClassVar[WireDtype]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_UNSPECIFIED: _ClassVar[Compression]
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_ZLIB: _ClassVar[Compression]

class ChecksumAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_ALGORITHM_UNSPECIFIED: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_CRC32C: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_CRC32: _ClassVar[ChecksumAlgorithm]

class Dtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[Dtype]
    DTYPE_FLOAT32: _ClassVar[Dtype]
    DTYPE_FLOAT64: _ClassVar[Dtype]
    DTYPE_FLOAT16: _ClassVar[Dtype]
    DTYPE_BFLOAT16: _ClassVar[Dtype]
    DTYPE_INT64: _ClassVar[Dtype]
    DTYPE_INT32: _ClassVar[Dtype]
    DTYPE_INT16: _ClassVar[Dtype]
    DTYPE_INT8: _ClassVar[Dtype]
    DTYPE_UINT8: _ClassVar[Dtype]
    DTYPE_BOOL: _ClassVar[Dtype]
WIRE_DTYPE_UNSPECIFIED: WireDtype
WIRE_DTYPE_NATIVE: WireDtype
WIRE_DTYPE_FLOAT16: WireDtype
WIRE_DTYPE_BFLOAT16: WireDtype
COMPRESSION_UNSPECIFIED: Compression
COMPRESSION_NONE: Compression
COMPRESSION_ZLIB: Compression
CHECKSUM_ALGORITHM_UNSPECIFIED: ChecksumAlgorithm
CHECKSUM_ALGORITHM_CRC32C: ChecksumAlgorithm
CHECKSUM_ALGORITHM_CRC32: ChecksumAlgorithm
DTYPE_UNSPECIFIED: Dtype
DTYPE_FLOAT32: Dtype
DTYPE_FLOAT64: Dtype
DTYPE_FLOAT16: Dtype
DTYPE_BFLOAT16: Dtype
DTYPE_INT64: Dtype
DTYPE_INT32: Dtype
DTYPE_INT16: Dtype
DTYPE_INT8: Dtype
DTYPE_UINT8: Dtype
DTYPE_BOOL: Dtype

class TensorSpec(_message.Message):
    __slots__ = ("shape", "dtype")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: Dtype
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[Dtype, str]] = ...) -> None: ...

class TensorGroup(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class TensorListHeader(_message.Message):
    __slots__ = ("tensors", "groups", "wire_dtype", "compression", "raw_bytes", "wire_bytes", "num_chunks", "checksum_algorithm")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    groups: _containers.RepeatedCompositeFieldContainer[TensorGroup]
    wire_dtype: WireDtype
    compression: Compression
    raw_bytes: int
    wire_bytes: int
    num_chunks: int
    checksum_algorithm: ChecksumAlgorithm
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[TensorGroup, _Mapping]]] = ..., wire_dtype: _Optional[_Union[WireDtype, str]] = ..., compression: _Optional[_Union[Compression, str]] = ..., raw_bytes: _Optional[int] = ..., wire_bytes: _Optional[int] = ..., num_chunks: _Optional[int] = ..., checksum_algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("header", "index", "data", "checksum")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    header: TensorListHeader
    index: int
    data: bytes
    checksum: int
    def __init__(self, header: _Optional[_Union[TensorListHeader, _Mapping]] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ..., checksum: _Optional[int] = ...) -> None: ...

class TransferSettings(_message.Message):
    __slots__ = ("wire_dtype", "compression", "chunk_bytes")
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    wire_dtype: WireDtype
    compression: Compression
    chunk_bytes: int
    def __init__(self, wire_dtype: _Optional[_Union[WireDtype, str]] = ..., compression: _Optional[_Union[Compression, str]] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

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
