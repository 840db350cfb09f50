from fedentrpc.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_PHASE_UNSPECIFIED: _ClassVar[RunPhase]
    RUN_PHASE_STARTING: _ClassVar[RunPhase]
    RUN_PHASE_ESTIMATING: _ClassVar[RunPhase]
    RUN_PHASE_TRAINING: _ClassVar[RunPhase]
    RUN_PHASE_AGGREGATING: _ClassVar[RunPhase]
    RUN_PHASE_EVALUATING: _ClassVar[RunPhase]
    RUN_PHASE_DONE: _ClassVar[RunPhase]
    RUN_PHASE_FAILED: _ClassVar[RunPhase]

class DownloadEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DOWNLOAD_ENCODING_UNSPECIFIED: _ClassVar[DownloadEncoding]
    DOWNLOAD_ENCODING_FULL: _ClassVar[DownloadEncoding]
    DOWNLOAD_ENCODING_DELTA: _ClassVar[DownloadEncoding]

class DeltaEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELTA_ENCODING_UNSPECIFIED: _ClassVar[DeltaEncoding]
    DELTA_ENCODING_XOR_PLANES: _ClassVar[DeltaEncoding]

class UploadState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPLOAD_STATE_UNSPECIFIED: _ClassVar[UploadState]
    UPLOAD_STATE_NONE: _ClassVar[UploadState]
    UPLOAD_STATE_PARTIAL: _ClassVar[UploadState]
    UPLOAD_STATE_COMPLETE: _ClassVar[UploadState]
RUN_PHASE_UNSPECIFIED: RunPhase
RUN_PHASE_STARTING: RunPhase
RUN_PHASE_ESTIMATING: RunPhase
RUN_PHASE_TRAINING: RunPhase
RUN_PHASE_AGGREGATING: RunPhase
RUN_PHASE_EVALUATING: RunPhase
RUN_PHASE_DONE: RunPhase
RUN_PHASE_FAILED: RunPhase
DOWNLOAD_ENCODING_UNSPECIFIED: DownloadEncoding
DOWNLOAD_ENCODING_FULL: DownloadEncoding
DOWNLOAD_ENCODING_DELTA: DownloadEncoding
DELTA_ENCODING_UNSPECIFIED: DeltaEncoding
DELTA_ENCODING_XOR_PLANES: DeltaEncoding
UPLOAD_STATE_UNSPECIFIED: UploadState
UPLOAD_STATE_NONE: UploadState
UPLOAD_STATE_PARTIAL: UploadState
UPLOAD_STATE_COMPLETE: UploadState

class RegisterRequest(_message.Message):
    __slots__ = ("worker_name", "token", "client_ids", "device", "hostname", "pid", "version")
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_name: str
    token: str
    client_ids: _containers.RepeatedScalarFieldContainer[int]
    device: str
    hostname: str
    pid: int
    version: str
    def __init__(self, worker_name: _Optional[str] = ..., token: _Optional[str] = ..., client_ids: _Optional[_Iterable[int]] = ..., device: _Optional[str] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("worker_id", "run_id", "partition_md5", "transfer", "heartbeat_s", "config", "download_encoding")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MD5_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    DOWNLOAD_ENCODING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    run_id: str
    partition_md5: str
    transfer: _tensor_pb2.TransferSettings
    heartbeat_s: float
    config: _struct_pb2.Struct
    download_encoding: DownloadEncoding
    def __init__(self, worker_id: _Optional[str] = ..., run_id: _Optional[str] = ..., partition_md5: _Optional[str] = ..., transfer: _Optional[_Union[_tensor_pb2.TransferSettings, _Mapping]] = ..., heartbeat_s: _Optional[float] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., download_encoding: _Optional[_Union[DownloadEncoding, str]] = ...) -> None: ...

class ClientInfo(_message.Message):
    __slots__ = ("cid", "num_samples", "label_counts", "data_source", "num_test_samples")
    CID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LABEL_COUNTS_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    NUM_TEST_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    cid: int
    num_samples: int
    label_counts: _containers.RepeatedScalarFieldContainer[int]
    data_source: str
    num_test_samples: int
    def __init__(self, cid: _Optional[int] = ..., num_samples: _Optional[int] = ..., label_counts: _Optional[_Iterable[int]] = ..., data_source: _Optional[str] = ..., num_test_samples: _Optional[int] = ...) -> None: ...

class ReadyRequest(_message.Message):
    __slots__ = ("worker_id", "partition_md5", "clients")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MD5_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    partition_md5: str
    clients: _containers.RepeatedCompositeFieldContainer[ClientInfo]
    def __init__(self, worker_id: _Optional[str] = ..., partition_md5: _Optional[str] = ..., clients: _Optional[_Iterable[_Union[ClientInfo, _Mapping]]] = ...) -> None: ...

class ReadyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class TaskHeader(_message.Message):
    __slots__ = ("task_id", "round", "client_ids", "model_blob", "deadline_unix")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_BLOB_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    round: int
    client_ids: _containers.RepeatedScalarFieldContainer[int]
    model_blob: str
    deadline_unix: float
    def __init__(self, task_id: _Optional[int] = ..., round: _Optional[int] = ..., client_ids: _Optional[_Iterable[int]] = ..., model_blob: _Optional[str] = ..., deadline_unix: _Optional[float] = ...) -> None: ...

class ProbeTask(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskHeader
    def __init__(self, task: _Optional[_Union[TaskHeader, _Mapping]] = ...) -> None: ...

class RoundPayload(_message.Message):
    __slots__ = ("round", "scalars", "per_client", "tensors_blob")
    class ScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class PerClientEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: _tensor_pb2.ScalarMap
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[_tensor_pb2.ScalarMap, _Mapping]] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    PER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    TENSORS_BLOB_FIELD_NUMBER: _ClassVar[int]
    round: int
    scalars: _containers.ScalarMap[str, float]
    per_client: _containers.MessageMap[int, _tensor_pb2.ScalarMap]
    tensors_blob: str
    def __init__(self, round: _Optional[int] = ..., scalars: _Optional[_Mapping[str, float]] = ..., per_client: _Optional[_Mapping[int, _tensor_pb2.ScalarMap]] = ..., tensors_blob: _Optional[str] = ...) -> None: ...

class FitTask(_message.Message):
    __slots__ = ("task", "payload")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    task: TaskHeader
    payload: RoundPayload
    def __init__(self, task: _Optional[_Union[TaskHeader, _Mapping]] = ..., payload: _Optional[_Union[RoundPayload, _Mapping]] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason", "failed")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    reason: str
    failed: bool
    def __init__(self, reason: _Optional[str] = ..., failed: _Optional[bool] = ...) -> None: ...

class EvaluateTask(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskHeader
    def __init__(self, task: _Optional[_Union[TaskHeader, _Mapping]] = ...) -> None: ...

class WorkResponse(_message.Message):
    __slots__ = ("probe", "fit", "shutdown", "evaluate", "secagg")
    PROBE_FIELD_NUMBER: _ClassVar[int]
    FIT_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    EVALUATE_FIELD_NUMBER: _ClassVar[int]
    SECAGG_FIELD_NUMBER: _ClassVar[int]
    probe: ProbeTask
    fit: FitTask
    shutdown: Shutdown
    evaluate: EvaluateTask
    secagg: SecAggTask
    def __init__(self, probe: _Optional[_Union[ProbeTask, _Mapping]] = ..., fit: _Optional[_Union[FitTask, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ..., evaluate: _Optional[_Union[EvaluateTask, _Mapping]] = ..., secagg: _Optional[_Union[SecAggTask, _Mapping]] = ...) -> None: ...

class SecAggTask(_message.Message):
    __slots__ = ("task", "requests")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    task: TaskHeader
    requests: _containers.ScalarMap[int, bytes]
    def __init__(self, task: _Optional[_Union[TaskHeader, _Mapping]] = ..., requests: _Optional[_Mapping[int, bytes]] = ...) -> None: ...

class AggregatorServiceFetchBlobRequest(_message.Message):
    __slots__ = ("blob_id", "worker_id", "start_chunk", "held")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    START_CHUNK_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    worker_id: str
    start_chunk: int
    held: HeldModel
    def __init__(self, blob_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., start_chunk: _Optional[int] = ..., held: _Optional[_Union[HeldModel, _Mapping]] = ...) -> None: ...

class HeldModel(_message.Message):
    __slots__ = ("blob_id", "digest")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    digest: bytes
    def __init__(self, blob_id: _Optional[str] = ..., digest: _Optional[bytes] = ...) -> None: ...

class AggregatorServiceFetchBlobResponse(_message.Message):
    __slots__ = ("chunk", "delta")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    chunk: _tensor_pb2.TensorChunk
    delta: ModelDelta
    def __init__(self, chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ..., delta: _Optional[_Union[ModelDelta, _Mapping]] = ...) -> None: ...

class ModelDelta(_message.Message):
    __slots__ = ("encoding", "base_blob", "base_digest", "digest", "wire_dtype")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    BASE_BLOB_FIELD_NUMBER: _ClassVar[int]
    BASE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    encoding: DeltaEncoding
    base_blob: str
    base_digest: bytes
    digest: bytes
    wire_dtype: _tensor_pb2.WireDtype
    def __init__(self, encoding: _Optional[_Union[DeltaEncoding, str]] = ..., base_blob: _Optional[str] = ..., base_digest: _Optional[bytes] = ..., digest: _Optional[bytes] = ..., wire_dtype: _Optional[_Union[_tensor_pb2.WireDtype, str]] = ...) -> None: ...

class Probe(_message.Message):
    __slots__ = ("cid", "num_samples", "scalars")
    class ScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    cid: int
    num_samples: int
    scalars: _containers.ScalarMap[str, float]
    def __init__(self, cid: _Optional[int] = ..., num_samples: _Optional[int] = ..., scalars: _Optional[_Mapping[str, float]] = ...) -> None: ...

class SubmitProbesRequest(_message.Message):
    __slots__ = ("worker_id", "task_id", "round", "probes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task_id: int
    round: int
    probes: _containers.RepeatedCompositeFieldContainer[Probe]
    def __init__(self, worker_id: _Optional[str] = ..., task_id: _Optional[int] = ..., round: _Optional[int] = ..., probes: _Optional[_Iterable[_Union[Probe, _Mapping]]] = ...) -> None: ...

class SubmitProbesResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("worker_id", "task_id", "round", "cid", "num_samples", "train_loss", "scalars", "resume_from_chunk")
    class ScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_CHUNK_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task_id: int
    round: int
    cid: int
    num_samples: int
    train_loss: float
    scalars: _containers.ScalarMap[str, float]
    resume_from_chunk: int
    def __init__(self, worker_id: _Optional[str] = ..., task_id: _Optional[int] = ..., round: _Optional[int] = ..., cid: _Optional[int] = ..., num_samples: _Optional[int] = ..., train_loss: _Optional[float] = ..., scalars: _Optional[_Mapping[str, float]] = ..., resume_from_chunk: _Optional[int] = ...) -> None: ...

class SubmitUpdateRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: UpdateHeader
    chunk: _tensor_pb2.TensorChunk
    def __init__(self, header: _Optional[_Union[UpdateHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class SubmitUpdateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryUploadRequest(_message.Message):
    __slots__ = ("worker_id", "task_id", "round", "cid")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task_id: int
    round: int
    cid: int
    def __init__(self, worker_id: _Optional[str] = ..., task_id: _Optional[int] = ..., round: _Optional[int] = ..., cid: _Optional[int] = ...) -> None: ...

class QueryUploadResponse(_message.Message):
    __slots__ = ("state", "next_chunk", "received_bytes")
    STATE_FIELD_NUMBER: _ClassVar[int]
    NEXT_CHUNK_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    state: UploadState
    next_chunk: int
    received_bytes: int
    def __init__(self, state: _Optional[_Union[UploadState, str]] = ..., next_chunk: _Optional[int] = ..., received_bytes: _Optional[int] = ...) -> None: ...

class ReportFailureRequest(_message.Message):
    __slots__ = ("worker_id", "task_id", "round", "cid", "message")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task_id: int
    round: int
    cid: int
    message: str
    def __init__(self, worker_id: _Optional[str] = ..., task_id: _Optional[int] = ..., round: _Optional[int] = ..., cid: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReportFailureResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("run_id", "algorithm", "round", "rounds", "workers", "clients", "phase", "error")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    algorithm: str
    round: int
    rounds: int
    workers: int
    clients: int
    phase: RunPhase
    error: str
    def __init__(self, run_id: _Optional[str] = ..., algorithm: _Optional[str] = ..., round: _Optional[int] = ..., rounds: _Optional[int] = ..., workers: _Optional[int] = ..., clients: _Optional[int] = ..., phase: _Optional[_Union[RunPhase, str]] = ..., error: _Optional[str] = ...) -> None: ...

class ClientEvaluation(_message.Message):
    __slots__ = ("cid", "num_samples", "loss", "accuracy")
    CID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    cid: int
    num_samples: int
    loss: float
    accuracy: float
    def __init__(self, cid: _Optional[int] = ..., num_samples: _Optional[int] = ..., loss: _Optional[float] = ..., accuracy: _Optional[float] = ...) -> None: ...

class SubmitEvaluationRequest(_message.Message):
    __slots__ = ("worker_id", "task_id", "round", "results")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task_id: int
    round: int
    results: _containers.RepeatedCompositeFieldContainer[ClientEvaluation]
    def __init__(self, worker_id: _Optional[str] = ..., task_id: _Optional[int] = ..., round: _Optional[int] = ..., results: _Optional[_Iterable[_Union[ClientEvaluation, _Mapping]]] = ...) -> None: ...

class SubmitEvaluationResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SubmitSecAggRequest(_message.Message):
    __slots__ = ("worker_id", "task_id", "round", "responses")
    class ResponsesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task_id: int
    round: int
    responses: _containers.ScalarMap[int, bytes]
    def __init__(self, worker_id: _Optional[str] = ..., task_id: _Optional[int] = ..., round: _Optional[int] = ..., responses: _Optional[_Mapping[int, bytes]] = ...) -> None: ...

class SubmitSecAggResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
