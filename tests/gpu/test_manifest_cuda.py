"""ExecutionManifest.from_contract over real CUDA tensors and PyTorch-captured graphs.

The manifest validates, its device views are the tensors' addresses, and its
spans and executable handles register with GraphReplayWorker, which replays a
graph chosen by its manifest entry. Device-address overlap and misalignment are
rejected with the offending buffer named.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("cuda.bindings")

from flare.contract import REC_KIND, REC_SLOT, GraphKind, PreparedContract  # noqa: E402
from flare.execution.manifest import DEVICE, HOST, ExecutionManifest, ManifestError  # noqa: E402
from flare.execution.replay import GraphReplayWorker, current_context  # noqa: E402
from tests.gpu.graphs import capture  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
CONTRACT = PreparedContract.build(max_active=4, context=256, prefill_chunk_size=128, num_pages=16,
                                  num_snapshot_rows=2, vocab_size=64, hidden_size=32)


class Owner:
    def __init__(self, **parts):
        self.__dict__.update(parts)


@pytest.fixture(scope="module")
def prepared():
    """Contract buffers on the GPU and one captured graph per contract graph, in one pool."""
    buffers = {b.name: torch.zeros(b.shape, dtype=getattr(torch, b.dtype), device=DEV) for b in CONTRACT.buffers()}
    records = buffers["out.records"]
    slots = torch.arange(CONTRACT.max_active + 1, dtype=torch.int64, device=DEV)
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    graphs = []
    for spec in CONTRACT.graphs:
        def body(kind=int(spec.kind)):
            frame = records[0]
            frame[:, REC_SLOT].copy_(slots)
            frame[:, REC_KIND].fill_(kind)

        graphs.append(capture(body, pool=pool, stream=stream)[0])
    torch.cuda.synchronize()
    handles = [int(g.raw_cuda_graph_exec()) for g in graphs]
    return Owner(buffers=buffers, slots=slots, graphs=graphs, pool=pool, handles=handles)


def test_from_contract_on_cuda_tensors_validates(prepared):
    manifest = ExecutionManifest.from_contract(CONTRACT, prepared.buffers, prepared.handles).validate()
    assert [v.space for v in manifest.buffers] == [DEVICE] * len(CONTRACT.buffers())
    for v in manifest.buffers:
        t = prepared.buffers[v.name]
        assert v.address == t.data_ptr(), f"{v.name}: manifest address {v.address:#x} != data_ptr {t.data_ptr():#x}"
        assert v.nbytes == t.numel() * t.element_size()
        assert v.address % v.alignment == 0
    assert manifest.exec_handles == prepared.handles
    assert len(set(prepared.handles)) == len(CONTRACT.graphs), "every captured graph has its own executable"
    assert manifest.spans(HOST) == []


def test_manifest_registers_with_the_replay_worker(prepared):
    manifest = ExecutionManifest.from_contract(CONTRACT, prepared.buffers, prepared.handles).validate()
    context, device = current_context()
    worker = GraphReplayWorker(prepared, context, device, manifest.exec_handles, manifest.spans(DEVICE))
    records = prepared.buffers["out.records"]
    for kind in (GraphKind.PREFILL, GraphKind.DECODE, GraphKind.RESUME):
        index = next(i for i, g in enumerate(manifest.graphs) if g.kind == kind)
        records.zero_()
        torch.cuda.synchronize()
        worker.submit(index)
        completion = worker.poll(timeout_ms=60_000)
        assert completion is not None and completion.ok, f"{manifest.graphs[index].name}: {completion}"
        frame = records[0].cpu()
        assert frame[:, REC_KIND].tolist() == [int(kind)] * (CONTRACT.max_active + 1), \
            f"graph {manifest.graphs[index].name!r} wrote kinds {frame[:, REC_KIND].tolist()}"
        assert frame[:, REC_SLOT].tolist() == list(range(CONTRACT.max_active + 1))
    worker.close()


def test_overlapping_device_views_are_rejected(prepared):
    # Two contract buffers carved from one allocation, the second starting inside the first.
    arena = torch.zeros(64, dtype=torch.int64, device=DEV)
    s1 = CONTRACT.max_active + 1
    carved = dict(prepared.buffers, **{"slot.token": arena[:s1], "slot.position": arena[2:2 + s1]})
    manifest = ExecutionManifest.from_contract(CONTRACT, carved, prepared.handles)
    with pytest.raises(ManifestError) as info:
        manifest.validate()
    assert info.value.entry == "buffer 'slot.position'", str(info.value)
    assert "device span" in str(info.value) and "overlaps buffer 'slot.token'" in str(info.value)


def test_misaligned_device_view_is_rejected(prepared):
    arena = torch.zeros(64, dtype=torch.int64, device=DEV)
    s1 = CONTRACT.max_active + 1
    shifted = dict(prepared.buffers, **{"slot.seed": arena[1:1 + s1]})  # 8 bytes past a 512-byte boundary
    manifest = ExecutionManifest.from_contract(CONTRACT, shifted, prepared.handles)
    with pytest.raises(ManifestError, match="not 16-byte aligned") as info:
        manifest.validate()
    assert info.value.entry == "buffer 'slot.seed'"


def test_duplicate_executables_are_rejected(prepared):
    manifest = ExecutionManifest.from_contract(CONTRACT, prepared.buffers, prepared.handles)
    graphs = list(manifest.graphs)
    graphs[1] = replace(graphs[1], handle=graphs[0].handle)
    with pytest.raises(ManifestError, match="duplicate executable handle"):
        replace(manifest, graphs=tuple(graphs)).validate()
