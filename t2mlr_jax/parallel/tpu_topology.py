"""The devices of a TPU topology ("v5e:2x2", "v5p:4x4x4", "v6e:8x8", "v4:2x2x2"), to compile programs for
from a machine without TPUs: libtpu builds the topology, `jax.jit(f).lower(...).compile()` on a mesh of
these devices compiles for it, and t2mlr_jax/parallel/compiled_report.py reads the result."""

from __future__ import annotations

import os

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
