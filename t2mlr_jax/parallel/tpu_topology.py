"""The devices of a TPU topology ("v5e:2x2", "v5p:4x4x4", "v6e:8x8", "v4:2x2x2"), to compile programs for
from a machine without TPUs: libtpu builds the topology, `jax.jit(f).lower(...).compile()` on a mesh of
these devices compiles for it, and t2mlr_jax/parallel/compiled_report.py reads the result."""

from __future__ import annotations

import os
import re

EXAMPLES = "v5e:2x2, v5e:16x16, v5p:4x4x4, v6e:8x8, v4:2x2x2"


def topology_devices(name: str) -> list:
    """One device per chip: v4 is built as megacore (each chip's two TensorCores one device, as v4 slices
    run and as `jax.make_mesh` requires; libtpu's default makes each TensorCore a device). libtpu is told
    not to ask a metadata server (there is none off Google Cloud) and not to lock itself to this process
    (another one may be compiling too); a variable already set is left as it is."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies  # after the variables: it loads libtpu

    config = "megacore" if name.startswith("v4") else "default"
    try:
        desc = topologies.get_topology_desc(topology_name=name, platform="tpu", chip_config_name=config)
    except Exception as error:  # noqa: BLE001 -- libtpu's reasons vary: each becomes one line naming it
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if "libtpu" not in reason and "tpu" in reason.lower() and "backend" in reason.lower():
            reason += " (no TPU compiler here? pip install 'libtpu==0.0.42.*', jax's tpu extra)"
        raise ValueError(f"TPU topology {name!r}: {reason} (e.g. {EXAMPLES})") from None
    return list(desc.devices)


# libtpu refuses a program whose temporaries exceed the chip's HBM, saying how much they need and how much
# it makes available: "... temporaries (132.00G) exceeds available HBM (15.75G)"
OUT_OF_HBM = re.compile(
    r"RESOURCE_EXHAUSTED: .*?temporaries \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)"
)
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


_AVAILABLE_HBM: dict[str, float | None] = {}  # per device kind: one refused compile each


def _refusal(device) -> float | None:
    import jax
    import jax.numpy as jnp

    x = jax.ShapeDtypeStruct((2**15, 2**15), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    try:  # 4 GiB in, 33 x 4 GiB out: more than any chip holds
        jax.jit(lambda x: [x * i for i in range(33)]).lower(x).compile()
    except Exception as error:  # noqa: BLE001 -- the refusal is the answer
        if found := OUT_OF_HBM.search(str(error)):
            return float(found.group(3)) * UNITS[found.group(4)]
    return None


def available_hbm_bytes(device) -> float | None:
    """The HBM libtpu lets one program use on `device`'s chip (v5e: 15.75 GiB of 16), read off its refusal
    of a program too large for any chip; None when no TPU compiler says (another platform)."""
    if getattr(device, "platform", None) != "tpu":
        return None
    if device.device_kind not in _AVAILABLE_HBM:
        _AVAILABLE_HBM[device.device_kind] = _refusal(device)
    return _AVAILABLE_HBM[device.device_kind]
