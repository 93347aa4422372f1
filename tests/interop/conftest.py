"""The interop tests run small PyTorch models next to JAX on a shared 2-core machine: one torch thread
avoids OpenMP oversubscription, which made transformers' generate 3-6x slower here."""

import torch

torch.set_num_threads(1)
