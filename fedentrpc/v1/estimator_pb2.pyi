from fedentrpc.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FedentVariant(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FEDENT_VARIANT_UNSPECIFIED: _ClassVar[FedentVariant]
    FEDENT_VARIANT_EXACT: _ClassVar[FedentVariant]
    FEDENT_VARIANT_PAPER: _ClassVar[FedentVariant]

class OfflineJobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OFFLINE_JOB_STATE_UNSPECIFIED: _ClassVar[OfflineJobState]
    OFFLINE_JOB_STATE_PENDING: _ClassVar[OfflineJobState]
    OFFLINE_JOB_STATE_RUNNING: _ClassVar[OfflineJobState]
    OFFLINE_JOB_STATE_DONE: _ClassVar[OfflineJobState]
    OFFLINE_JOB_STATE_FAILED: _ClassVar[OfflineJobState]

class OfflineStopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OFFLINE_STOP_REASON_UNSPECIFIED: _ClassVar[OfflineStopReason]
    OFFLINE_STOP_REASON_CONVERGED: _ClassVar[OfflineStopReason]
    OFFLINE_STOP_REASON_MAX_SWEEPS: _ClassVar[OfflineStopReason]

class Phi2Rate(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHI2_RATE_UNSPECIFIED: _ClassVar[Phi2Rate]
    PHI2_RATE_USED: _ClassVar[Phi2Rate]
    PHI2_RATE_STAR: _ClassVar[Phi2Rate]

class EstimatorMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ESTIMATOR_MODE_UNSPECIFIED: _ClassVar[EstimatorMode]
    ESTIMATOR_MODE_ONLINE: _ClassVar[EstimatorMode]
    ESTIMATOR_MODE_OFFLINE: _ClassVar[EstimatorMode]

class OfflineClients(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OFFLINE_CLIENTS_UNSPECIFIED: _ClassVar[OfflineClients]
    OFFLINE_CLIENTS_PARTICIPANTS: _ClassVar[OfflineClients]
    OFFLINE_CLIENTS_POPULATION: _ClassVar[OfflineClients]

class RateControl(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RATE_CONTROL_UNSPECIFIED: _ClassVar[RateControl]
    RATE_CONTROL_ADAPTIVE: _ClassVar[RateControl]
    RATE_CONTROL_SHUFFLED: _ClassVar[RateControl]
    RATE_CONTROL_FIXED: _ClassVar[RateControl]
FEDENT_VARIANT_UNSPECIFIED: FedentVariant
FEDENT_VARIANT_EXACT: FedentVariant
FEDENT_VARIANT_PAPER: FedentVariant
OFFLINE_JOB_STATE_UNSPECIFIED: OfflineJobState
OFFLINE_JOB_STATE_PENDING: OfflineJobState
OFFLINE_JOB_STATE_RUNNING: OfflineJobState
OFFLINE_JOB_STATE_DONE: OfflineJobState
OFFLINE_JOB_STATE_FAILED: OfflineJobState
OFFLINE_STOP_REASON_UNSPECIFIED: OfflineStopReason
OFFLINE_STOP_REASON_CONVERGED: OfflineStopReason
OFFLINE_STOP_REASON_MAX_SWEEPS: OfflineStopReason
PHI2_RATE_UNSPECIFIED: Phi2Rate
PHI2_RATE_USED: Phi2Rate
PHI2_RATE_STAR: Phi2Rate
ESTIMATOR_MODE_UNSPECIFIED: EstimatorMode
ESTIMATOR_MODE_ONLINE: EstimatorMode
ESTIMATOR_MODE_OFFLINE: EstimatorMode
OFFLINE_CLIENTS_UNSPECIFIED: OfflineClients
OFFLINE_CLIENTS_PARTICIPANTS: OfflineClients
OFFLINE_CLIENTS_POPULATION: OfflineClients
RATE_CONTROL_UNSPECIFIED: RateControl
RATE_CONTROL_ADAPTIVE: RateControl
RATE_CONTROL_SHUFFLED: RateControl
RATE_CONTROL_FIXED: RateControl

class FedEntParams(_message.Message):
    __slots__ = ("beta", "gamma", "tol", "max_iter", "variant", "eta_max", "phi2_rate", "estimator", "eps1", "eps2", "max_sweeps", "probe_batch_size", "offline_clients", "rates", "shuffle_seed")
    BETA_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    TOL_FIELD_NUMBER: _ClassVar[int]
    MAX_ITER_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    ETA_MAX_FIELD_NUMBER: _ClassVar[int]
    PHI2_RATE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATOR_FIELD_NUMBER: _ClassVar[int]
    EPS1_FIELD_NUMBER: _ClassVar[int]
    EPS2_FIELD_NUMBER: _ClassVar[int]
    MAX_SWEEPS_FIELD_NUMBER: _ClassVar[int]
    PROBE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    RATES_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_SEED_FIELD_NUMBER: _ClassVar[int]
    beta: float
    gamma: float
    tol: float
    max_iter: int
    variant: FedentVariant
    eta_max: float
    phi2_rate: Phi2Rate
    estimator: EstimatorMode
    eps1: float
    eps2: float
    max_sweeps: int
    probe_batch_size: int
    offline_clients: OfflineClients
    rates: RateControl
    shuffle_seed: int
    def __init__(self, beta: _Optional[float] = ..., gamma: _Optional[float] = ..., tol: _Optional[float] = ..., max_iter: _Optional[int] = ..., variant: _Optional[_Union[FedentVariant, str]] = ..., eta_max: _Optional[float] = ..., phi2_rate: _Optional[_Union[Phi2Rate, str]] = ..., estimator: _Optional[_Union[EstimatorMode, str]] = ..., eps1: _Optional[float] = ..., eps2: _Optional[float] = ..., max_sweeps: _Optional[int] = ..., probe_batch_size: _Optional[int] = ..., offline_clients: _Optional[_Union[OfflineClients, str]] = ..., rates: _Optional[_Union[RateControl, str]] = ..., shuffle_seed: _Optional[int] = ...) -> None: ...

class ClientScalars(_message.Message):
    __slots__ = ("cid", "a", "b", "num_samples", "theta", "eta_prev")
    CID_FIELD_NUMBER: _ClassVar[int]
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    THETA_FIELD_NUMBER: _ClassVar[int]
    ETA_PREV_FIELD_NUMBER: _ClassVar[int]
    cid: int
    a: float
    b: float
    num_samples: int
    theta: float
    eta_prev: float
    def __init__(self, cid: _Optional[int] = ..., a: _Optional[float] = ..., b: _Optional[float] = ..., num_samples: _Optional[int] = ..., theta: _Optional[float] = ..., eta_prev: _Optional[float] = ...) -> None: ...

class SolveOnlineRequest(_message.Message):
    __slots__ = ("run_id", "round", "c", "clients", "params", "phi2_init")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    C_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PHI2_INIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    c: float
    clients: _containers.RepeatedCompositeFieldContainer[ClientScalars]
    params: FedEntParams
    phi2_init: float
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., c: _Optional[float] = ..., clients: _Optional[_Iterable[_Union[ClientScalars, _Mapping]]] = ..., params: _Optional[_Union[FedEntParams, _Mapping]] = ..., phi2_init: _Optional[float] = ...) -> None: ...

class SolveOnlineResponse(_message.Message):
    __slots__ = ("phi2_next", "iterations", "converged", "diagnostics", "report")
    class DiagnosticsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PHI2_NEXT_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    phi2_next: float
    iterations: int
    converged: bool
    diagnostics: _containers.ScalarMap[str, float]
    report: _struct_pb2.Struct
    def __init__(self, phi2_next: _Optional[float] = ..., iterations: _Optional[int] = ..., converged: _Optional[bool] = ..., diagnostics: _Optional[_Mapping[str, float]] = ..., report: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class PutBlobRequest(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: _tensor_pb2.TensorChunk
    def __init__(self, chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class PutBlobResponse(_message.Message):
    __slots__ = ("blob_id", "wire_bytes")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    wire_bytes: int
    def __init__(self, blob_id: _Optional[str] = ..., wire_bytes: _Optional[int] = ...) -> None: ...

class EstimatorServiceFetchBlobRequest(_message.Message):
    __slots__ = ("blob_id", "worker_id")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    worker_id: str
    def __init__(self, blob_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class EstimatorServiceFetchBlobResponse(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: _tensor_pb2.TensorChunk
    def __init__(self, chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class StartOfflineRequest(_message.Message):
    __slots__ = ("run_id", "init_blob", "clients", "rounds", "params", "seed", "batch_size", "wait_workers_s", "schedule", "base_lr")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INIT_BLOB_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    WAIT_WORKERS_S_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    BASE_LR_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    init_blob: str
    clients: _containers.RepeatedCompositeFieldContainer[OfflineClient]
    rounds: int
    params: FedEntParams
    seed: int
    batch_size: int
    wait_workers_s: float
    schedule: _containers.RepeatedCompositeFieldContainer[RoundClients]
    base_lr: float
    def __init__(self, run_id: _Optional[str] = ..., init_blob: _Optional[str] = ..., clients: _Optional[_Iterable[_Union[OfflineClient, _Mapping]]] = ..., rounds: _Optional[int] = ..., params: _Optional[_Union[FedEntParams, _Mapping]] = ..., seed: _Optional[int] = ..., batch_size: _Optional[int] = ..., wait_workers_s: _Optional[float] = ..., schedule: _Optional[_Iterable[_Union[RoundClients, _Mapping]]] = ..., base_lr: _Optional[float] = ...) -> None: ...

class RoundClients(_message.Message):
    __slots__ = ("cids",)
    CIDS_FIELD_NUMBER: _ClassVar[int]
    cids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cids: _Optional[_Iterable[int]] = ...) -> None: ...

class StartOfflineResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: OfflineJob
    def __init__(self, job: _Optional[_Union[OfflineJob, _Mapping]] = ...) -> None: ...

class OfflineClient(_message.Message):
    __slots__ = ("cid", "num_samples", "owner")
    CID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    cid: int
    num_samples: int
    owner: str
    def __init__(self, cid: _Optional[int] = ..., num_samples: _Optional[int] = ..., owner: _Optional[str] = ...) -> None: ...

class GetOfflineRequest(_message.Message):
    __slots__ = ("job_id", "wait_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    wait_s: float
    def __init__(self, job_id: _Optional[str] = ..., wait_s: _Optional[float] = ...) -> None: ...

class GetOfflineResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: OfflineJob
    def __init__(self, job: _Optional[_Union[OfflineJob, _Mapping]] = ...) -> None: ...

class OfflineJob(_message.Message):
    __slots__ = ("job_id", "sweep", "message", "phi2", "state", "stop_reason", "report")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PHI2_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    sweep: int
    message: str
    phi2: _containers.RepeatedScalarFieldContainer[float]
    state: OfflineJobState
    stop_reason: OfflineStopReason
    report: _struct_pb2.Struct
    def __init__(self, job_id: _Optional[str] = ..., sweep: _Optional[int] = ..., message: _Optional[str] = ..., phi2: _Optional[_Iterable[float]] = ..., state: _Optional[_Union[OfflineJobState, str]] = ..., stop_reason: _Optional[_Union[OfflineStopReason, str]] = ..., report: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class OracleHello(_message.Message):
    __slots__ = ("worker_id", "run_id", "client_ids", "token")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    run_id: str
    client_ids: _containers.RepeatedScalarFieldContainer[int]
    token: str
    def __init__(self, worker_id: _Optional[str] = ..., run_id: _Optional[str] = ..., client_ids: _Optional[_Iterable[int]] = ..., token: _Optional[str] = ...) -> None: ...

class GradientTask(_message.Message):
    __slots__ = ("request_id", "sweep", "t", "client_ids", "point_blob", "seed", "batch_size")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    T_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    POINT_BLOB_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    sweep: int
    t: int
    client_ids: _containers.RepeatedScalarFieldContainer[int]
    point_blob: str
    seed: int
    batch_size: int
    def __init__(self, request_id: _Optional[int] = ..., sweep: _Optional[int] = ..., t: _Optional[int] = ..., client_ids: _Optional[_Iterable[int]] = ..., point_blob: _Optional[str] = ..., seed: _Optional[int] = ..., batch_size: _Optional[int] = ...) -> None: ...

class OracleResultHeader(_message.Message):
    __slots__ = ("request_id", "cid", "num_samples")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    cid: int
    num_samples: int
    def __init__(self, request_id: _Optional[int] = ..., cid: _Optional[int] = ..., num_samples: _Optional[int] = ...) -> None: ...

class OracleError(_message.Message):
    __slots__ = ("request_id", "cid", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    cid: int
    message: str
    def __init__(self, request_id: _Optional[int] = ..., cid: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class OracleRequest(_message.Message):
    __slots__ = ("hello", "result", "chunk", "error")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    hello: OracleHello
    result: OracleResultHeader
    chunk: _tensor_pb2.TensorChunk
    error: OracleError
    def __init__(self, hello: _Optional[_Union[OracleHello, _Mapping]] = ..., result: _Optional[_Union[OracleResultHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ..., error: _Optional[_Union[OracleError, _Mapping]] = ...) -> None: ...

class OracleResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: GradientTask
    def __init__(self, task: _Optional[_Union[GradientTask, _Mapping]] = ...) -> None: ...
