"""ExecutionManifest: the prepared execution ABI, checked before startup.

A manifest lists, for one loaded core, every captured graph (kind, capacities,
executable handle) and every I/O buffer view (address space, address, extent,
shape, byte strides, alignment, handle), plus the completion-record geometry.
:meth:`ExecutionManifest.validate` checks the metadata the executor relies on:
capacities, byte arithmetic, C-contiguity, alignment, unique names and
handles, non-overlapping spans per address space, required buffers and the
records buffer's geometry. It cannot prove that addresses refer to live
allocations or that graphs compute anything sensible: the owner keeps those
alive on the declared context. docs/manifest.md is the reference.

The module imports neither torch nor CUDA; :meth:`ExecutionManifest.from_contract`
reads tensors only through ``data_ptr``, ``shape``, ``stride`` and friends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ..config import PAGE_TOKENS
from ..contract import FRAMES, RECORD_META, RECORD_TOKENS, GraphKind, PreparedContract
from ..errors import ExecutionError

HOST = "host"  # pinned or pageable host memory, addressed by the CPU
DEVICE = "device"  # device memory on the manifest's CUDA context
SPACES = (HOST, DEVICE)

# 16 bytes: the widest vector access (ld/st.global.v4.b32) a kernel may issue on a view.
# Fresh torch allocations exceed it (64 bytes on the CPU, 512 on CUDA's caching allocator).
VIEW_ALIGNMENT = 16
# Prefill token capacities are whole KV pages, so a chunk never splits a page.
PREFILL_TOKEN_QUANTUM = PAGE_TOKENS
# Completion records are indexed by step.frame, one frame a submission in flight (flare.contract).
COMPLETION_FRAMES = FRAMES
DEFAULT_COMPLETION_TOKENS = 8  # an omitted or zero completion token capacity
RECORDS_BUFFER = "out.records"
RECORD_ITEMSIZE = 8  # records are int64
# What the frame executor touches by name when the manifest is not built from a contract.
REQUIRED_BUFFERS = ("step.frame", "out.records", "out.logprobs", "out.top_ids")
_ADDRESS_LIMIT = 1 << 64


class ManifestError(ExecutionError):
    """A manifest violation; ``entry`` names the offending entry, ``problem`` says what is wrong."""

    code = "manifest_error"

    def __init__(self, entry: str, problem: str):
        super().__init__(f"execution manifest: {entry}: {problem}")
        self.entry = entry
        self.problem = problem


@dataclass(frozen=True)
class GraphEntry:
    """One captured graph; its position in ``ExecutionManifest.graphs`` is its graph index."""

    name: str  # GraphSpec.label, e.g. "decode b8 t1"
    kind: GraphKind
    batch: int  # row capacity b: a power of two
    tokens: int  # token capacity t per row: 1 for decode, a multiple of 64 for prefill
    handle: int  # CUgraphExec address, as raw_cuda_graph_exec() returns it


@dataclass(frozen=True)
class BufferView:
    """A contiguous span of one address space that graphs or frames read or write."""

    name: str  # contract buffer name ("slot.token", "out.records", ...)
    space: str  # HOST or DEVICE
    address: int  # first byte
    nbytes: int  # extent in bytes: prod(shape) * itemsize
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # byte strides, C-contiguous for the shape
    itemsize: int  # bytes per element
    alignment: int  # required alignment of address, a power of two >= itemsize
    handle: int  # the buffer's ABI identifier: the contract's buffer ordinal

    def __post_init__(self) -> None:
        # Lists compare unequal to tuples; keep the geometry comparisons honest.
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "strides", tuple(self.strides))

    @property
    def end(self) -> int:
        return self.address + self.nbytes

    @property
    def span(self) -> tuple[int, int]:
        """``(address, nbytes)``, the form GraphReplayWorker registers."""
        return (self.address, self.nbytes)

    @classmethod
    def from_tensor(cls, name: str, tensor, *, handle: int, alignment: int = VIEW_ALIGNMENT) -> "BufferView":
        """Describe a torch tensor: a CUDA tensor is a device view, a CPU tensor a host view."""
        device_type = tensor.device.type
        if device_type not in ("cuda", "cpu"):
            raise ManifestError(f"buffer {name!r}", f"tensors on {device_type} have no manifest address space")
        itemsize = tensor.element_size()
        return cls(name=name, space=DEVICE if device_type == "cuda" else HOST, address=int(tensor.data_ptr()),
                   nbytes=tensor.numel() * itemsize, shape=tuple(int(n) for n in tensor.shape),
                   strides=tuple(int(s) * itemsize for s in tensor.stride()), itemsize=itemsize,
                   alignment=alignment, handle=handle)


@dataclass(frozen=True)
class CompletionGeometry:
    """Shape of one completion frame: a record per physical slot (row 0 is the padding slot)."""

    request_slots: int  # S: physical request slots 1..S
    metadata_fields: int = RECORD_META  # the 16 REC_* fields
    token_capacity: int | None = None  # token fields per record; None or 0 resolves to 8

    def __post_init__(self) -> None:
        if not self.token_capacity:
            object.__setattr__(self, "token_capacity", DEFAULT_COMPLETION_TOKENS)

    @property
    def record_fields(self) -> int:
        return self.metadata_fields + self.token_capacity

    @property
    def record_rows(self) -> int:
        return self.request_slots + 1

    @property
    def records_shape(self) -> tuple[int, int, int]:
        return (COMPLETION_FRAMES, self.record_rows, self.record_fields)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _c_strides_problem(view: BufferView) -> str | None:
    """Why the strides are not C-contiguous, or None. Size-1 dims may carry any stride (as in torch)."""
    expected = view.itemsize
    for dim in range(len(view.shape) - 1, -1, -1):
        if view.shape[dim] != 1 and view.strides[dim] != expected:
            return (f"byte strides {view.strides} are not C-contiguous for shape {view.shape} "
                    f"(dim {dim} has stride {view.strides[dim]}, expected {expected})")
        expected *= view.shape[dim]
    return None


def _span_text(view: BufferView) -> str:
    return f"[{view.address:#x}, {view.end:#x})"


@dataclass(frozen=True)
class ExecutionManifest:
    """The prepared execution ABI of one loaded core (see docs/manifest.md)."""

    graphs: tuple[GraphEntry, ...]
    buffers: tuple[BufferView, ...]
    completion: CompletionGeometry
    required: tuple[str, ...] = field(default=REQUIRED_BUFFERS)  # buffer names that must be present

    # -- lookups -----------------------------------------------------------------

    def buffer(self, name: str) -> BufferView:
        for view in self.buffers:
            if view.name == name:
                return view
        raise ManifestError(f"buffer {name!r}", "not in the manifest")

    @property
    def exec_handles(self) -> list[int]:
        """Executable handles in graph-index order."""
        return [g.handle for g in self.graphs]

    def spans(self, space: str = DEVICE) -> list[tuple[int, int]]:
        """``(address, nbytes)`` of every view in ``space``, for GraphReplayWorker registration."""
        return [v.span for v in self.buffers if v.space == space]

    # -- construction ------------------------------------------------------------

    @classmethod
    def from_contract(cls, contract: PreparedContract, buffers: Mapping[str, object],
                      exec_handles: Sequence[int], *, alignment: int = VIEW_ALIGNMENT) -> "ExecutionManifest":
        """The manifest of a loaded model: views of the contract's buffers, one entry per graph.

        ``buffers`` maps contract buffer names to tensors (StepPrograms.buffers);
        ``exec_handles`` holds one executable per contract graph, in graph-index
        order. A tensor whose shape or dtype differs from the contract is
        rejected here; a missing buffer is left for :meth:`validate` to report.
        """
        if len(exec_handles) != len(contract.graphs):
            raise ManifestError("graphs", f"{len(exec_handles)} executable handles for "
                                          f"{len(contract.graphs)} contract graphs")
        graphs = tuple(GraphEntry(spec.label, spec.kind, spec.batch, spec.tokens, int(handle))
                       for spec, handle in zip(contract.graphs, exec_handles))
        specs = contract.buffers()
        views = []
        for ordinal, spec in enumerate(specs):
            tensor = buffers.get(spec.name)
            if tensor is None:
                continue
            dtype = str(tensor.dtype).removeprefix("torch.")
            if tuple(tensor.shape) != spec.shape or dtype != spec.dtype:
                raise ManifestError(f"buffer {spec.name!r}",
                                    f"tensor is {dtype}{list(tensor.shape)}, the contract declares "
                                    f"{spec.dtype}{list(spec.shape)}")
            views.append(BufferView.from_tensor(spec.name, tensor, handle=ordinal, alignment=alignment))
        completion = CompletionGeometry(contract.max_active, RECORD_META, RECORD_TOKENS)
        return cls(graphs, tuple(views), completion, tuple(spec.name for spec in specs))

    # -- validation --------------------------------------------------------------

    def validate(self) -> "ExecutionManifest":
        """Raise :class:`ManifestError` naming the first offending entry; return self when valid."""
        if not self.graphs:
            raise ManifestError("graphs", "the manifest declares no graphs")
        for index, graph in enumerate(self.graphs):
            _check_graph(index, graph)
        _check_unique(((f"graph {i} {g.name!r}", g.name) for i, g in enumerate(self.graphs)), "graph name")
        _check_unique(((f"graph {i} {g.name!r}", g.handle) for i, g in enumerate(self.graphs)),
                      "executable handle")
        for view in self.buffers:
            _check_view(view)
        _check_unique(((f"buffer {v.name!r}", v.name) for v in self.buffers), "buffer name")
        _check_unique(((f"buffer {v.name!r}", v.handle) for v in self.buffers), "buffer handle")
        _check_overlaps(self.buffers)
        names = {v.name for v in self.buffers}
        for name in self.required:
            if name not in names:
                raise ManifestError(f"buffer {name!r}", "required buffer is missing")
        self._check_completion()
        return self

    def _check_completion(self) -> None:
        geometry = self.completion
        entry = "completion geometry"
        if not _is_int(geometry.request_slots) or geometry.request_slots < 1:
            raise ManifestError(entry, f"request_slots must be a positive integer, got {geometry.request_slots!r}")
        if geometry.metadata_fields != RECORD_META:
            raise ManifestError(entry, f"records carry exactly {RECORD_META} metadata fields, "
                                       f"got {geometry.metadata_fields!r}")
        if not _is_int(geometry.token_capacity) or geometry.token_capacity < 1:
            raise ManifestError(entry, f"token capacity must be a positive integer, got {geometry.token_capacity!r}")
        by_name = {v.name: v for v in self.buffers}
        records = by_name.get(RECORDS_BUFFER)
        if records is None:
            raise ManifestError(f"buffer {RECORDS_BUFFER!r}", "the completion records buffer is missing")
        if records.shape != geometry.records_shape or records.itemsize != RECORD_ITEMSIZE:
            raise ManifestError(
                f"buffer {RECORDS_BUFFER!r}",
                f"records are {records.itemsize}-byte {list(records.shape)}, the completion geometry needs "
                f"{RECORD_ITEMSIZE}-byte {list(geometry.records_shape)} ({COMPLETION_FRAMES} frames x "
                f"{geometry.request_slots} slots + padding row x {geometry.metadata_fields} metadata + "
                f"{geometry.token_capacity} token fields)")
        frame_rows = (COMPLETION_FRAMES, geometry.record_rows)
        for view in self.buffers:
            if view.name.startswith("out.") and view.shape[:2] != frame_rows:
                raise ManifestError(f"buffer {view.name!r}",
                                    f"outputs are indexed [frame, slot, ...]: leading dims {list(view.shape[:2])} "
                                    f"do not match the records' {list(frame_rows)}")


def _check_graph(index: int, graph: GraphEntry) -> None:
    entry = f"graph {index} {graph.name!r}"
    if not isinstance(graph.name, str) or not graph.name:
        raise ManifestError(f"graph {index}", "graph name must be a non-empty string")
    if not isinstance(graph.kind, GraphKind):
        raise ManifestError(entry, f"kind {graph.kind!r} is not a GraphKind")
    if graph.kind == GraphKind.MIXED:  # decode width (a power of two or 0) plus its prefill rows
        if not _is_int(graph.batch) or graph.batch < 1:
            raise ManifestError(entry, f"mixed row capacity must be a positive integer, got {graph.batch!r}")
    elif not _is_int(graph.batch) or not _is_power_of_two(graph.batch):
        raise ManifestError(entry, f"batch capacity must be a power of two >= 1, got {graph.batch!r}")
    if not _is_int(graph.tokens) or graph.tokens < 1:
        raise ManifestError(entry, f"token capacity must be a positive integer, got {graph.tokens!r}")
    if graph.kind == GraphKind.DECODE and graph.tokens != 1:
        raise ManifestError(entry, f"decode token capacity must be 1, got {graph.tokens}")
    if graph.kind in (GraphKind.PREFILL, GraphKind.MIXED) and graph.tokens % PREFILL_TOKEN_QUANTUM:
        raise ManifestError(entry, f"{graph.kind.name.lower()} token capacity must be a positive multiple of "
                                   f"{PREFILL_TOKEN_QUANTUM}, got {graph.tokens}")
    if not _is_int(graph.handle) or not 0 < graph.handle < _ADDRESS_LIMIT:
        raise ManifestError(entry, f"executable handle must be a non-null 64-bit address, got {graph.handle!r}")


def _check_view(view: BufferView) -> None:
    if not isinstance(view.name, str) or not view.name:
        raise ManifestError(f"buffer {view.name!r}", "buffer name must be a non-empty string")
    entry = f"buffer {view.name!r}"
    if view.space not in SPACES:
        raise ManifestError(entry, f"address space {view.space!r} is not one of {SPACES}")
    if not _is_int(view.handle) or view.handle < 0:
        raise ManifestError(entry, f"handle must be a non-negative integer, got {view.handle!r}")
    if not _is_int(view.itemsize) or not _is_power_of_two(view.itemsize):
        raise ManifestError(entry, f"itemsize must be a power of two, got {view.itemsize!r}")
    if not _is_int(view.alignment) or not _is_power_of_two(view.alignment) or view.alignment < view.itemsize:
        raise ManifestError(entry, f"required alignment must be a power of two >= itemsize {view.itemsize}, "
                                   f"got {view.alignment!r}")
    shape, strides = view.shape, view.strides
    if not shape or not all(_is_int(n) and n >= 1 for n in shape):
        raise ManifestError(entry, f"shape must be non-empty with positive extents, got {view.shape!r}")
    if len(strides) != len(shape) or not all(_is_int(s) for s in strides):
        raise ManifestError(entry, f"byte strides {view.strides!r} do not fit shape {view.shape!r}")
    elements = 1
    for n in shape:
        elements *= n
    if not _is_int(view.nbytes) or view.nbytes != elements * view.itemsize:
        raise ManifestError(entry, f"byte extent {view.nbytes!r} disagrees with shape {list(shape)} x "
                                   f"itemsize {view.itemsize} = {elements * view.itemsize}")
    problem = _c_strides_problem(view)
    if problem:
        raise ManifestError(entry, problem)
    if not _is_int(view.address) or view.address <= 0 or view.address + view.nbytes > _ADDRESS_LIMIT:
        raise ManifestError(entry, f"span at {view.address!r} + {view.nbytes} bytes is not a non-null "
                                   f"64-bit address range")
    if view.address % view.alignment:
        raise ManifestError(entry, f"address {view.address:#x} is not {view.alignment}-byte aligned "
                                   f"(offset {view.address % view.alignment})")


def _check_unique(items: Iterable[tuple[str, object]], what: str) -> None:
    seen: dict[object, str] = {}
    for entry, key in items:
        if key in seen:
            raise ManifestError(entry, f"duplicate {what} {key!r} (also used by {seen[key]})")
        seen[key] = entry


def _check_overlaps(views: Sequence[BufferView]) -> None:
    for space in SPACES:
        ordered = sorted((v for v in views if v.space == space), key=lambda v: (v.address, v.end))
        reach: BufferView | None = None  # the view reaching furthest so far
        for view in ordered:
            if reach is not None and view.address < reach.end:
                raise ManifestError(f"buffer {view.name!r}",
                                    f"{space} span {_span_text(view)} overlaps buffer {reach.name!r} "
                                    f"{_span_text(reach)}")
            if reach is None or view.end > reach.end:
                reach = view
