"""The interop tests run small PyTorch models next to JAX on a shared 2-core machine: one torch thread
avoids OpenMP oversubscription, which made transformers' generate 3-6x slower here.

`imported`: a release test module's committed fixture (its FIXTURE folder), imported once per module."""

import pytest
import torch

from t2mlr_jax.interop import load_pretrained

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def imported(request):
    """`load_pretrained(FIXTURE / "model")` of the requesting module, or its own `LOAD` in load_pretrained's
    place (PonderLM-2's folders); a module whose fixture differs defines its own `imported`."""
    module = request.module
    return getattr(module, "LOAD", load_pretrained)(module.FIXTURE / "model")
