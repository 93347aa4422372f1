"""The one table of accelerator facts the compiled-program report divides by, keyed by jax's `device_kind`.

Every figure is the vendor's public per-chip value, read off the page named in `source`:
- peak: dense bf16 FLOP/s (NVIDIA's tables also list a 2x "with sparsity" figure: not this one);
- HBM: bytes of memory (binary GiB where the page says GiB; TPU pages that say "GB" for HBM are read as GiB
  too, the power of two the stacks come in; NVIDIA's "GB" are decimal);
- HBM bandwidth: bytes/s, decimal (GBps = 1e9);
- interconnect: the bidirectional aggregate bytes/s of one chip over all its ICI ports (TPU) or NVLink
  (GPU), as Google's and NVIDIA's tables give it. Older Google pages gave v5e 1600 Gbps and v5p 4800 Gbps,
  half the bidirectional 400 GBps and 1200 GBps they state now;
- ICI ports: a TPU chip's links, one per torus neighbour: 4 on the 2-D tori (v5e, v6e: "ICI ports per
  chip 4", "2D torus"), 6 on the 3-D ones (v4, v5p: "3D torus"); each link carries interconnect / (2 x
  ports) each way (v5e 50 GB/s, v5p and v6e 100 GB/s). None: a switch (NVLink), one link each way at half
  the bidirectional figure. Wraparound (`Chip.wraps`): a 2-D pod is a 16 x 16 torus, so an axis of 16
  chips closes into a ring; a 3-D slice of whole 4x4x4 cubes is a full 3-D torus ("All 4x4x4 and larger
  slices have full 3D torus", the v5p page), smaller ones are open.

A device is not always a chip: a v4 topology built here (`v4:2x2x2`) has two devices per chip, one per
TensorCore (no megacore), and each gets half the chip (`Chip.split`).
"""

from __future__ import annotations

import dataclasses

GIB = float(2**30)


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: float
    hbm_bytes_per_s: float
    interconnect_bytes_per_s: float  # bidirectional, all ports of the chip together
    source: str
    ici_ports: int | None = None  # torus links per chip; None: a switch

    @property
    def link_bytes_per_s(self) -> float:
        """One direction of one link."""
        return self.interconnect_bytes_per_s / (2 * (self.ici_ports or 1))

    def wraps(self, extents: tuple[int, ...]) -> tuple[bool, ...]:
        """Per torus axis of a slice `extents` chips long, whether wraparound links close it into a ring."""
        if self.ici_ports == 6:
            return (all(e % 4 == 0 for e in extents),) * len(extents)
        return tuple(e == 16 for e in extents)

    def split(self, devices_per_chip: int) -> Chip:
        """One device's share when a chip is `devices_per_chip` devices."""
        n = float(devices_per_chip)
        return dataclasses.replace(
            self,
            name=self.name if devices_per_chip == 1 else f"{self.name} (1/{devices_per_chip} chip)",
            peak_flops=self.peak_flops / n,
            hbm_bytes=self.hbm_bytes / n,
            hbm_bytes_per_s=self.hbm_bytes_per_s / n,
            interconnect_bytes_per_s=self.interconnect_bytes_per_s / n,
        )


CHIPS: dict[str, Chip] = {
    "TPU v4": Chip(
        "TPU v4",
        275e12,
        32 * GIB,
        1200e9,
        # The v4 page states no ICI figure; 2400 Gbps is the older pages' convention (see above), doubled
        # to bidirectional like v5e's and v5p's.
        600e9,
        "https://cloud.google.com/tpu/docs/v4",
        ici_ports=6,
    ),
    "TPU v5 lite": Chip(
        "TPU v5e", 197e12, 16 * GIB, 819e9, 400e9, "https://cloud.google.com/tpu/docs/v5e", ici_ports=4
    ),
    "TPU v5": Chip(
        "TPU v5p", 459e12, 95 * GIB, 2765e9, 1200e9, "https://cloud.google.com/tpu/docs/v5p", ici_ports=6
    ),
    "TPU v6 lite": Chip(
        "TPU v6e (Trillium)",
        918e12,
        32 * GIB,
        1638e9,
        800e9,
        "https://cloud.google.com/tpu/docs/v6e",
        ici_ports=4,
    ),
    "NVIDIA H100 80GB HBM3": Chip(
        "H100 SXM", 989.4e12, 80e9, 3.35e12, 900e9, "https://www.nvidia.com/en-us/data-center/h100/"
    ),
    "NVIDIA H200": Chip(
        "H200 SXM", 989.4e12, 141e9, 4.8e12, 900e9, "https://www.nvidia.com/en-us/data-center/h200/"
    ),
    "NVIDIA H100 PCIe": Chip(
        "H100 PCIe", 756e12, 80e9, 2.0e12, 600e9, "https://www.nvidia.com/en-us/data-center/h100/"
    ),
    "NVIDIA A100-SXM4-80GB": Chip(
        "A100 SXM 80GB", 312e12, 80e9, 2.039e12, 600e9, "https://www.nvidia.com/en-us/data-center/a100/"
    ),
    "NVIDIA A100-SXM4-40GB": Chip(
        "A100 SXM 40GB", 312e12, 40e9, 1.555e12, 600e9, "https://www.nvidia.com/en-us/data-center/a100/"
    ),
}


def chip_of(device_kind: str) -> Chip:
    if device_kind not in CHIPS:
        raise ValueError(f"no chip facts for device kind {device_kind!r}; known: {sorted(CHIPS)}")
    return CHIPS[device_kind]
