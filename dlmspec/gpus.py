"""GPU catalog: the figures the validator and planner need for each accelerator.

Figures are the vendors' datasheet values for dense (non-sparse) math: NVIDIA A100 (2020),
H100 (2022, SXM5 and PCIe), H200 (2024), B200/GB200 (2024, HGX B200 and GB200 NVL72 per GPU),
L40S (2023). ``memory_bytes`` is what ``torch.cuda.get_device_properties().total_memory``
reports on such a card (slightly below the marketing GB figure), so the memory check compares
like with like. Bandwidths are per GPU, one direction.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True)
class GPU:
    """One accelerator model.

    Attributes:
        id: catalog id users write in ``[cluster] gpu``.
        name: the vendor's name.
        memory_bytes: usable device memory, bytes.
        bf16_tflops: dense bf16/fp16 tensor-core peak, TFLOP/s.
        fp8_tflops: dense fp8 peak, TFLOP/s (0 where the GPU has no fp8 tensor cores).
        fp32_tflops: plain fp32 (non-tensor) peak, TFLOP/s.
        hbm_gbps: memory bandwidth, GB/s.
        nvlink_gbps: NVLink bandwidth per GPU per direction, GB/s (PCIe figure without NVLink).
        compute_capability: CUDA compute capability ``(major, minor)``.
    """

    id: str
    name: str
    memory_bytes: int
    bf16_tflops: float
    fp8_tflops: float
    fp32_tflops: float
    hbm_gbps: float
    nvlink_gbps: float
    compute_capability: tuple[int, int]

    @property
    def supports_fp8(self) -> bool:
        """fp8 tensor cores exist from compute capability 8.9 (Ada, Hopper, Blackwell)."""
        return self.compute_capability >= (8, 9)


GPUS: dict[str, GPU] = {
    g.id: g
    for g in [
        GPU("a100-40gb", "NVIDIA A100-SXM4-40GB", 39 * GiB + 512 * 1024**2, 312, 0, 19.5, 1555, 300, (8, 0)),
        GPU("a100-80gb", "NVIDIA A100-SXM4-80GB", 79 * GiB + 256 * 1024**2, 312, 0, 19.5, 2039, 300, (8, 0)),
        GPU("h100", "NVIDIA H100 80GB HBM3 (SXM5)", 79 * GiB + 640 * 1024**2, 989, 1979, 67, 3350, 450, (9, 0)),
        GPU("h100-pcie", "NVIDIA H100 PCIe", 79 * GiB + 640 * 1024**2, 756, 1513, 51, 2000, 64, (9, 0)),
        GPU("h200", "NVIDIA H200 (SXM)", 140 * GiB + 409 * 1024**2, 989, 1979, 67, 4800, 450, (9, 0)),
        GPU("b200", "NVIDIA B200 (HGX)", 178 * GiB + 362 * 1024**2, 2250, 4500, 80, 8000, 900, (10, 0)),
        GPU("gb200", "NVIDIA GB200 (per GPU, NVL72)", 184 * GiB, 2500, 5000, 80, 8000, 900, (10, 0)),
        GPU("l40s", "NVIDIA L40S", 44 * GiB + 352 * 1024**2, 362, 733, 91.6, 864, 32, (8, 9)),
    ]
}


def gpu_ids() -> list[str]:
    """Catalog ids, sorted."""
    return sorted(GPUS)


def get_gpu(gpu_id: str) -> GPU:
    """Look up a GPU by catalog id.

    Raises:
        KeyError: ``gpu_id`` is not in the catalog (see :func:`gpu_ids`).
    """
    return GPUS[gpu_id]
