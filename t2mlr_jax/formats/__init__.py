"""Checkpoint formats: the machinery every PyTorch layout shares (files.py: weight files and export
folders; configs.py: HF config.json <-> ModelConfig; tables.py: state-dict rules; tokenizer_files.py), the
formats no research system owns (hf.py, gguf.py, nanochat.py with its PyTorch reference nanochat_torch.py)
and FORMATS, the registry every format (a system's release layout too) registers into (registry.py).

Below the architectures: a system's package builds its release layout on this. Importing it imports
nothing (the T²MLR PyTorch reference reads files.py without JAX)."""
