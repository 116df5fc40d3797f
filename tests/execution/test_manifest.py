"""ExecutionManifest: a valid manifest from a PreparedContract, and every rejection validate() makes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from flare.contract import FRAMES, RECORD_FIELDS, RECORD_META, GraphKind, PreparedContract
from flare.errors import ExecutionError
from flare.execution.manifest import (
    DEVICE,
    HOST,
    REQUIRED_BUFFERS,
    VIEW_ALIGNMENT,
    BufferView,
    CompletionGeometry,
    ExecutionManifest,
    GraphEntry,
    ManifestError,
)

CONTRACT = PreparedContract.build(max_active=4, context=256, prefill_chunk_size=128, num_pages=16,
                                  num_snapshot_rows=2, vocab_size=64, hidden_size=32)


@pytest.fixture(scope="module")
def buffers() -> dict[str, torch.Tensor]:
    return {b.name: torch.zeros(b.shape, dtype=getattr(torch, b.dtype)) for b in CONTRACT.buffers()}


@pytest.fixture(scope="module")
def handles() -> list[int]:
    return [0x7F00_0000 + 0x200 * i for i in range(len(CONTRACT.graphs))]


@pytest.fixture(scope="module")
def manifest(buffers, handles) -> ExecutionManifest:
    return ExecutionManifest.from_contract(CONTRACT, buffers, handles)


def with_view(m: ExecutionManifest, name: str, **changes) -> ExecutionManifest:
    return replace(m, buffers=tuple(replace(v, **changes) if v.name == name else v for v in m.buffers))


def with_graph(m: ExecutionManifest, index: int, **changes) -> ExecutionManifest:
    return replace(m, graphs=tuple(replace(g, **changes) if i == index else g for i, g in enumerate(m.graphs)))


def rejects(m: ExecutionManifest, entry: str, *fragments: str) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        m.validate()
    err = info.value
    assert isinstance(err, ExecutionError)
    assert err.entry == entry, f"error names {err.entry!r}, expected {entry!r}: {err}"
    for fragment in fragments:
        assert fragment in str(err), f"{fragment!r} missing from {err}"
    return err


def view(name: str, address: int, shape: tuple[int, ...], *, itemsize: int = 8, space: str = DEVICE,
         handle: int = 0, strides: tuple[int, ...] | None = None, alignment: int = VIEW_ALIGNMENT) -> BufferView:
    if strides is None:
        strides, step = [], itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    return BufferView(name, space, address, nbytes, tuple(shape), tuple(strides), itemsize, alignment, handle)


def small_manifest(*extra: BufferView, slots: int = 2) -> ExecutionManifest:
    """A hand-built manifest: records and the required buffers at fixed device addresses."""
    rows = slots + 1
    base = [
        view("step.frame", 0x10000, (1,), handle=0),
        view("out.records", 0x20000, (FRAMES, rows, RECORD_FIELDS), handle=1),
        view("out.logprobs", 0x30000, (FRAMES, rows, 3), itemsize=4, handle=2),
        view("out.top_ids", 0x40000, (FRAMES, rows, 2), handle=3),
    ]
    extra = tuple(replace(v, handle=v.handle or 10 + i) for i, v in enumerate(extra))
    graphs = (GraphEntry("decode b1 t1", GraphKind.DECODE, 1, 1, 0xA000),
              GraphEntry("prefill b1 t64", GraphKind.PREFILL, 1, 64, 0xB000))
    return ExecutionManifest(graphs, tuple(base) + extra, CompletionGeometry(slots))


# -- a valid manifest -------------------------------------------------------------------------------------

def test_from_contract_with_cpu_tensors_validates(manifest, buffers, handles):
    assert manifest.validate() is manifest
    assert [g.name for g in manifest.graphs] == [g.label for g in CONTRACT.graphs]
    assert [(g.kind, g.batch, g.tokens) for g in manifest.graphs] == [(g.kind, g.batch, g.tokens)
                                                                       for g in CONTRACT.graphs]
    assert manifest.exec_handles == handles
    assert manifest.required == tuple(b.name for b in CONTRACT.buffers())
    assert [v.name for v in manifest.buffers] == [b.name for b in CONTRACT.buffers()]
    for ordinal, v in enumerate(manifest.buffers):
        t = buffers[v.name]
        assert v.space == HOST  # CPU tensors are host views
        assert v.address == t.data_ptr()
        assert v.nbytes == t.numel() * t.element_size()
        assert v.shape == tuple(t.shape)
        assert v.strides == tuple(s * t.element_size() for s in t.stride())
        assert v.itemsize == t.element_size()
        assert v.alignment == VIEW_ALIGNMENT
        assert v.handle == ordinal
    geometry = manifest.completion
    assert geometry.request_slots == CONTRACT.max_active
    assert geometry.metadata_fields == RECORD_META == 16
    assert geometry.records_shape == tuple(buffers["out.records"].shape)
    assert manifest.spans(HOST) == [(t.data_ptr(), t.numel() * t.element_size()) for t in buffers.values()]
    assert manifest.spans(DEVICE) == []
    assert manifest.buffer("step.frame").span == (buffers["step.frame"].data_ptr(), 8)


def test_hand_built_manifest_validates():
    m = small_manifest(view("slot.token", 0x50000, (3,)), view("staging", 0x20000, (64,), space=HOST, itemsize=1,
                                                              alignment=1))
    # The same address in two spaces is two different bytes.
    assert m.validate() is m


def test_token_capacity_omitted_or_zero_resolves_to_eight():
    assert CompletionGeometry(4).token_capacity == 8
    assert CompletionGeometry(4, token_capacity=0).token_capacity == 8
    assert CompletionGeometry(4, token_capacity=3).token_capacity == 3
    assert CompletionGeometry(4).records_shape == (FRAMES, 5, 24)
    small_manifest().validate()  # records of 16 + 8 fields match an omitted capacity


def test_lookup_of_unknown_buffer_names_it(manifest):
    with pytest.raises(ManifestError, match="'nope'"):
        manifest.buffer("nope")


# -- overlapping spans ------------------------------------------------------------------------------------

def test_overlapping_device_spans_are_rejected():
    m = small_manifest(view("a", 0x50000, (8,)), view("b", 0x50000 + 32, (8,)))
    rejects(m, "buffer 'b'", "overlaps buffer 'a'", "[0x50000, 0x50040)", "device")


def test_overlap_with_an_earlier_longer_span_is_found_past_a_shorter_one():
    big = view("big", 0x50000, (1000,))
    inner = view("inner", 0x50100, (4,))
    later = view("later", 0x51000, (4,))  # inside big, after inner ended
    rejects(small_manifest(big, inner, later), "buffer 'inner'", "overlaps buffer 'big'")
    m = small_manifest(big, later)
    rejects(m, "buffer 'later'", "overlaps buffer 'big'")


def test_overlapping_host_spans_are_rejected():
    m = small_manifest(view("f0", 0x90000, (64,), space=HOST), view("f1", 0x90000 + 64 * 8 - 16, (4,), space=HOST))
    rejects(m, "buffer 'f1'", "host span", "overlaps buffer 'f0'")


def test_adjacent_spans_do_not_overlap():
    small_manifest(view("a", 0x50000, (8,)), view("b", 0x50000 + 64, (8,))).validate()


def test_contract_views_of_one_storage_overlap(manifest, buffers):
    token = buffers["slot.token"]
    m = with_view(manifest, "slot.position", address=token.data_ptr() + 16)
    rejects(m, "buffer 'slot.position'", "overlaps buffer 'slot.token'")


# -- alignment, contiguity, extents -----------------------------------------------------------------------

def test_misaligned_view_is_rejected(manifest, buffers):
    m = with_view(manifest, "slot.seed", address=buffers["slot.seed"].data_ptr() + 8)
    rejects(m, "buffer 'slot.seed'", "not 16-byte aligned", "offset 8")


@pytest.mark.parametrize("alignment", [0, 3, 4, 24])
def test_bad_alignment_declaration_is_rejected(alignment):
    m = small_manifest(view("a", 0x50000, (4,), alignment=alignment))  # itemsize 8
    rejects(m, "buffer 'a'", "power of two >= itemsize 8")


def test_transposed_strides_are_not_contiguous():
    m = small_manifest(view("a", 0x50000, (4, 6), strides=(8, 32)))
    rejects(m, "buffer 'a'", "not C-contiguous for shape (4, 6)", "dim 1")


def test_padded_row_strides_are_not_contiguous():
    m = small_manifest(view("a", 0x50000, (4, 6), strides=(64, 8)))
    rejects(m, "buffer 'a'", "dim 0 has stride 64, expected 48")


def test_size_one_dims_may_carry_any_stride():
    small_manifest(view("a", 0x50000, (1, 6), strides=(999, 8))).validate()


def test_non_contiguous_tensor_from_torch_is_rejected():
    base = torch.zeros(8, 4, dtype=torch.int64)
    v = BufferView.from_tensor("slot.t", base.t(), handle=20)
    rejects(small_manifest(v), "buffer 'slot.t'", "not C-contiguous")


def test_strides_of_wrong_rank_are_rejected():
    rejects(small_manifest(view("a", 0x50000, (4, 6), strides=(8,))), "buffer 'a'", "do not fit shape")


@pytest.mark.parametrize("nbytes", [8 * 23, 8 * 25, 0, -8])
def test_byte_extent_must_equal_shape_times_itemsize(nbytes):
    m = small_manifest(replace(view("a", 0x50000, (4, 6)), nbytes=nbytes))
    rejects(m, "buffer 'a'", f"byte extent {nbytes}", "= 192")


@pytest.mark.parametrize("shape", [(), (0,), (4, 0), (-1,)])
def test_empty_or_negative_shapes_are_rejected(shape):
    v = BufferView("a", DEVICE, 0x50000, 0, shape, (8,) * len(shape), 8, 16, 20)
    rejects(small_manifest(v), "buffer 'a'", "positive extents")


@pytest.mark.parametrize("itemsize", [0, 3, 6])
def test_itemsize_must_be_a_power_of_two(itemsize):
    v = BufferView("a", DEVICE, 0x50000, 4 * itemsize, (4,), (itemsize,), itemsize, 16, 20)
    rejects(small_manifest(v), "buffer 'a'", "itemsize must be a power of two")


@pytest.mark.parametrize("address", [0, -16, (1 << 64) - 16])
def test_null_or_out_of_range_addresses_are_rejected(address):
    rejects(small_manifest(view("a", address, (4,))), "buffer 'a'", "64-bit address range")


def test_unknown_address_space_is_rejected():
    rejects(small_manifest(view("a", 0x50000, (4,), space="gpu")), "buffer 'a'", "address space 'gpu'")


# -- names and handles ------------------------------------------------------------------------------------

def test_duplicate_buffer_names_are_rejected():
    m = small_manifest(view("slot.token", 0x50000, (4,)), view("slot.token", 0x60000, (4,)))
    rejects(m, "buffer 'slot.token'", "duplicate buffer name 'slot.token'")


def test_duplicate_graph_names_are_rejected(manifest):
    m = with_graph(manifest, 1, name=manifest.graphs[0].name)
    rejects(m, f"graph 1 {manifest.graphs[0].name!r}", "duplicate graph name", "graph 0")


def test_duplicate_buffer_handles_are_rejected(manifest):
    m = with_view(manifest, "slot.seed", handle=manifest.buffer("slot.token").handle)
    rejects(m, "buffer 'slot.seed'", "duplicate buffer handle", "buffer 'slot.token'")


def test_duplicate_graph_handles_are_rejected(manifest):
    last = len(manifest.graphs) - 1
    m = with_graph(manifest, last, handle=manifest.graphs[2].handle)
    rejects(m, f"graph {last} {manifest.graphs[last].name!r}", "duplicate executable handle")


@pytest.mark.parametrize("handle", [0, -1, 1 << 64, 1.5])
def test_null_or_invalid_executable_handle_is_rejected(manifest, handle):
    rejects(with_graph(manifest, 0, handle=handle), f"graph 0 {manifest.graphs[0].name!r}", "executable handle")


def test_negative_buffer_handle_is_rejected(manifest):
    rejects(with_view(manifest, "slot.seed", handle=-1), "buffer 'slot.seed'", "handle must be a non-negative")


# -- capacities -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [0, -2, 3, 6, 12, True])
def test_batch_capacity_must_be_a_power_of_two(manifest, batch):
    rejects(with_graph(manifest, 0, batch=batch), f"graph 0 {manifest.graphs[0].name!r}",
            "batch capacity must be a power of two")


@pytest.mark.parametrize("tokens", [0, 2, 64])
def test_decode_token_capacity_must_be_one(tokens):
    m = with_graph(small_manifest(), 0, tokens=tokens)
    rejects(m, "graph 0 'decode b1 t1'", "token capacity")


@pytest.mark.parametrize("tokens", [0, -64, 1, 32, 96, 100])
def test_prefill_token_capacity_must_be_a_positive_multiple_of_64(tokens):
    m = with_graph(small_manifest(), 1, tokens=tokens)
    rejects(m, "graph 1 'prefill b1 t64'", "token capacity")


def test_prefill_capacities_that_are_multiples_of_64_are_accepted():
    for tokens in (64, 128, 192, 2048):
        with_graph(small_manifest(), 1, tokens=tokens).validate()


def test_graph_kind_must_be_a_graph_kind():
    rejects(with_graph(small_manifest(), 0, kind=3), "graph 0 'decode b1 t1'", "not a GraphKind")


def test_manifest_without_graphs_is_rejected():
    rejects(replace(small_manifest(), graphs=()), "graphs", "no graphs")


# -- completion geometry and required buffers -------------------------------------------------------------

def test_records_for_a_different_slot_count_are_rejected(manifest):
    m = replace(manifest, completion=CompletionGeometry(CONTRACT.max_active + 1, RECORD_META, 8))
    rejects(m, "buffer 'out.records'", f"[{FRAMES}, 5, 24]", f"needs 8-byte [{FRAMES}, 6, 24]")


def test_records_for_a_different_token_capacity_are_rejected(manifest):
    m = replace(manifest, completion=CompletionGeometry(CONTRACT.max_active, RECORD_META, 4))
    rejects(m, "buffer 'out.records'", f"[{FRAMES}, 5, 20]", "4 token fields")


def test_records_of_the_wrong_itemsize_are_rejected():
    m = small_manifest()
    records = m.buffer("out.records")
    m = with_view(m, "out.records", itemsize=4, nbytes=records.nbytes // 2,
                  strides=tuple(s // 2 for s in records.strides))
    rejects(m, "buffer 'out.records'", "4-byte")


def test_metadata_field_count_is_fixed_at_16():
    m = replace(small_manifest(), completion=CompletionGeometry(2, metadata_fields=15, token_capacity=9))
    rejects(m, "completion geometry", "exactly 16 metadata fields")


@pytest.mark.parametrize("slots", [0, -1])
def test_request_slots_must_be_positive(slots):
    rejects(replace(small_manifest(), completion=CompletionGeometry(slots)), "completion geometry", "request_slots")


def test_negative_token_capacity_is_rejected():
    m = replace(small_manifest(), completion=CompletionGeometry(2, token_capacity=-8))
    rejects(m, "completion geometry", "token capacity")


def test_outputs_must_share_the_records_frame_and_slot_dims():
    m = small_manifest()
    m = with_view(m, "out.top_ids", shape=(FRAMES, 4, 2), nbytes=FRAMES * 4 * 2 * 8, strides=(64, 16, 8))
    rejects(m, "buffer 'out.top_ids'", f"leading dims [{FRAMES}, 4]", f"[{FRAMES}, 3]")


@pytest.mark.parametrize("name", REQUIRED_BUFFERS)
def test_missing_required_buffer_is_rejected(name):
    m = small_manifest()
    m = replace(m, buffers=tuple(v for v in m.buffers if v.name != name))
    rejects(m, f"buffer {name!r}", "required buffer is missing")


def test_missing_records_buffer_is_rejected_even_when_not_listed_as_required():
    m = small_manifest()
    m = replace(m, buffers=tuple(v for v in m.buffers if v.name != "out.records"), required=())
    rejects(m, "buffer 'out.records'", "records buffer is missing")


def test_contract_buffer_missing_from_the_tensors_is_reported_by_validate(buffers, handles):
    partial = {k: v for k, v in buffers.items() if k != "slot.page_table"}
    m = ExecutionManifest.from_contract(CONTRACT, partial, handles)
    rejects(m, "buffer 'slot.page_table'", "required buffer is missing")


# -- from_contract rejections -----------------------------------------------------------------------------

def test_from_contract_needs_one_handle_per_graph(buffers, handles):
    with pytest.raises(ManifestError, match=f"{len(handles) - 1} executable handles for {len(handles)}") as info:
        ExecutionManifest.from_contract(CONTRACT, buffers, handles[:-1])
    assert info.value.entry == "graphs"


def test_from_contract_rejects_a_tensor_of_the_wrong_shape(buffers, handles):
    wrong = dict(buffers, **{"step.slots": torch.zeros(CONTRACT.max_batch + 1, dtype=torch.int64)})
    with pytest.raises(ManifestError, match=r"int64\[5\], the contract declares int64\[4\]") as info:
        ExecutionManifest.from_contract(CONTRACT, wrong, handles)
    assert info.value.entry == "buffer 'step.slots'"


def test_from_contract_rejects_a_tensor_of_the_wrong_dtype(buffers, handles):
    wrong = dict(buffers, **{"slot.sampling": buffers["slot.sampling"].to(torch.float64)})
    with pytest.raises(ManifestError, match="float64.*declares float32") as info:
        ExecutionManifest.from_contract(CONTRACT, wrong, handles)
    assert info.value.entry == "buffer 'slot.sampling'"


def test_from_contract_rejects_tensors_on_other_devices(buffers, handles):
    meta = dict(buffers, **{"step.frame": torch.zeros(1, dtype=torch.int64, device="meta")})
    with pytest.raises(ManifestError, match="tensors on meta"):
        ExecutionManifest.from_contract(CONTRACT, meta, handles)
