"""The control-flow codes of a batch (`batch["control_flow"]`, one per token), free of JAX so that the
PyTorch reference and the data pipeline read them too: padding, prompt / non-recurrent (never fused with
R), recurrent (fused with the previous token's R at l_start)."""

PAD, PROMPT, RECURRENT = 0, 1, 2
